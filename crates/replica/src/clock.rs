//! The node's wall clock, with an injectable skew (offset and rate) so tests
//! can bump, strobe or drift one node's time without faking the process
//! clock (which hangs tokio).

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

/// Wall-clock milliseconds since the Unix epoch, plus an injectable skew.
#[derive(Clone, Debug, Default)]
pub struct Clock {
    skew: Arc<Mutex<Skew>>,
}

fn system_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

impl Clock {
    /// The system clock with no skew.
    pub fn system() -> Self {
        Self::default()
    }

    /// Now, in Unix milliseconds (saturating at 0 for a wild negative skew).
    pub fn now_ms(&self) -> u64 {
        let skew = self.skew.lock().map(|s| *s).unwrap_or_default();
        let system = system_ms();
        let drift = ((system - skew.anchor_ms) as f64 * (skew.rate - 1.0)) as i64;
        let skewed = system.saturating_add(skew.offset_ms).saturating_add(drift);
        u64::try_from(skewed).unwrap_or(0)
    }

    /// Skews this node's clock by `offset_ms`, running at `rate` times real
    /// time from now on (fault injection). A rate of 0 or less, or not
    /// finite, is read as 1.
    pub fn set_skew(&self, offset_ms: i64, rate: f64) {
        let rate = if rate.is_finite() && rate > 0.0 { rate } else { 1.0 };
        if let Ok(mut skew) = self.skew.lock() {
            *skew = Skew { offset_ms, rate, anchor_ms: system_ms() };
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
}
