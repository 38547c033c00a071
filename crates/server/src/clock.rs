//! The node's wall clock, with an injectable offset so tests can skew one
//! node's time without faking the process clock (which hangs tokio).

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch, plus a settable offset.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    offset_ms: Arc<AtomicI64>,
}

impl Clock {
    /// The system clock with no offset.
    pub fn system() -> Self {
        Self::default()
    }

    /// Now, in Unix milliseconds (saturating at 0 for a wild negative offset).
    pub fn now_ms(&self) -> u64 {
        let system_ms =
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        let skewed = system_ms.saturating_add(self.offset_ms.load(Ordering::Relaxed));
        u64::try_from(skewed).unwrap_or(0)
    }

    /// Skews this node's clock by `offset_ms` (fault injection).
    pub fn set_offset_ms(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_moves_the_clock() {
        let clock = Clock::system();
        let before = clock.now_ms();
        clock.set_offset_ms(3_600_000);
        let skewed = clock.now_ms();
        assert!(skewed >= before + 3_600_000, "skewed {skewed} before {before}");
        clock.set_offset_ms(0);
        assert!(clock.now_ms() < skewed);
    }
}
