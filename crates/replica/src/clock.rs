//! The node's wall clock: a time source (the system clock for the node, a
//! simulated host's clock in the simulation) plus an injectable skew
//! (offset and rate), so tests can bump, strobe or drift one node's time
//! without faking the process clock (which hangs tokio).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Clone, Copy, Debug, PartialEq)]
struct Skew {
    offset_ms: i64,
    rate: f64,
    anchor_ms: i64,
}

impl Default for Skew {
    fn default() -> Self {
        Skew { offset_ms: 0, rate: 1.0, anchor_ms: 0 }
    }
}

/// Where a [`Clock`] reads the time before its skew: wall-clock
/// milliseconds since the Unix epoch.
pub type TimeSource = Arc<dyn Fn() -> i64 + Send + Sync>;

/// Wall-clock milliseconds since the Unix epoch, read from a time source,
/// plus an injectable skew.
#[derive(Clone)]
pub struct Clock {
    source: TimeSource,
    skew: Arc<Mutex<Skew>>,
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let skew = self.skew.lock().map(|s| *s).unwrap_or_default();
        f.debug_struct("Clock").field("skew", &skew).finish_non_exhaustive()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::system()
    }
}

fn system_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Clock {
    /// The system clock with no skew: what a node runs on.
    pub fn system() -> Self {
        Self::from_source(Arc::new(system_ms))
    }

    /// A clock that reads `source` instead of the system clock, with no
    /// skew: a simulation hands each host its own simulated wall clock, so
    /// what the node stamps follows simulated time. The skew set later
    /// applies on top of the source, as on the system clock.
    pub fn from_source(source: TimeSource) -> Self {
        Clock { source, skew: Arc::default() }
    }

    /// Now, in Unix milliseconds (saturating at 0 for a wild negative skew).
    pub fn now_ms(&self) -> u64 {
        let skew = self.skew.lock().map(|s| *s).unwrap_or_default();
        let source = (self.source)();
        let drift = (source.saturating_sub(skew.anchor_ms) as f64 * (skew.rate - 1.0)) as i64;
        let skewed = source.saturating_add(skew.offset_ms).saturating_add(drift);
        u64::try_from(skewed).unwrap_or(0)
    }

    /// Skews this node's clock by `offset_ms`, running at `rate` times real
    /// time from now on (fault injection). A rate of 0 or less, or not
    /// finite, is read as 1.
    pub fn set_skew(&self, offset_ms: i64, rate: f64) {
        let rate = if rate.is_finite() && rate > 0.0 { rate } else { 1.0 };
        let anchor_ms = (self.source)();
        if let Ok(mut skew) = self.skew.lock() {
            *skew = Skew { offset_ms, rate, anchor_ms };
        }
    }

    /// Skews this node's clock by `offset_ms` at real-time rate.
    pub fn set_offset_ms(&self, offset_ms: i64) {
        self.set_skew(offset_ms, 1.0);
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

    #[test]
    fn rate_makes_the_clock_drift() {
        let clock = Clock::system();
        clock.set_skew(0, 100.0);
        let start = clock.now_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let elapsed = clock.now_ms() - start;
        // 20 ms of real time at 100x is about 2 s of node time.
        assert!(elapsed >= 1_500, "elapsed {elapsed} ms");
    }

    #[test]
    fn a_source_replaces_the_system_clock_and_the_skew_applies_on_top() {
        let now_ms = Arc::new(std::sync::atomic::AtomicI64::new(1_000_000));
        let source = now_ms.clone();
        let clock =
            Clock::from_source(Arc::new(move || source.load(std::sync::atomic::Ordering::SeqCst)));
        assert_eq!(clock.now_ms(), 1_000_000, "the source, not the system clock");
        now_ms.store(1_000_250, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(clock.now_ms(), 1_000_250, "it follows the source");
        // An offset and a double rate, anchored at the source's time.
        clock.set_skew(-100, 2.0);
        assert_eq!(clock.now_ms(), 1_000_150);
        now_ms.store(1_001_250, std::sync::atomic::Ordering::SeqCst);
        // 1,000 ms of source time at twice the rate, 100 ms behind.
        assert_eq!(clock.now_ms(), 1_002_150);
    }
}
