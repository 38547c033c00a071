//! Waiting on a named condition with a deadline: the only way a harness
//! waits. A timeout says what was awaited and what was last seen.

use std::future::Future;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::time::Instant;

/// How often a condition is re-checked while waiting for it.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The answer of one look at a condition.
pub enum Check<T> {
    /// The condition holds; the wait is over and answers this value.
    Done(T),
    /// Not yet; the text says what was seen, for the timeout message.
    NotYet(String),
}

/// Waits until `check` answers [`Check::Done`], re-checking every
/// [`POLL_INTERVAL`], and fails with `what` and the last observation once
/// `deadline` passes. An `Err` from `check` is fatal and ends the wait at
/// once (a process that died will not come back by waiting).
pub async fn wait_until<T, F, Fut>(what: &str, deadline: Instant, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>>>,
{
    let started = Instant::now();
    loop {
        let seen = match check().await.with_context(|| format!("while waiting for {what}"))? {
            Check::Done(value) => return Ok(value),
            Check::NotYet(seen) => seen,
        };
        if Instant::now() >= deadline {
            bail!(
                "timed out after {:.1} s waiting for {what}; last seen: {seen}",
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep_until((Instant::now() + POLL_INTERVAL).min(deadline)).await;
    }
}

/// A deadline `within` from now.
pub fn deadline_in(within: Duration) -> Instant {
    Instant::now() + within
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_ends_when_done_and_times_out_naming_what_it_saw() -> Result<()> {
        let mut looks = 0;
        let done = wait_until("three looks", deadline_in(Duration::from_secs(5)), || {
            looks += 1;
            let seen = looks;
            async move {
                Ok(if seen >= 3 { Check::Done(seen) } else { Check::NotYet(format!("{seen}")) })
            }
        })
        .await?;
        assert_eq!(done, 3);
        let never = wait_until("never", deadline_in(Duration::from_millis(120)), || async {
            Ok(Check::<()>::NotYet("still nothing".into()))
        })
        .await;
        let message = never.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("never") && message.contains("still nothing"), "{message}");
        Ok(())
    }
}
