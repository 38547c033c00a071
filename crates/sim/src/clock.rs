//! Each simulated host's wall clock: the simulation's one true time,
//! shifted by a fixed skew, stretched by a drift, and stepped ahead by
//! jumps the plan injects.
//!
//! turmoil keeps one simulated clock for the whole run; that is the real
//! time the checkers judge leases by. A host's wall clock is what its node
//! would read from the system (the time it stamps into entries when it
//! leads), and may disagree with real time and with other hosts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use leasehold_raft::NodeId;
use leasehold_replica::Clock;

/// Where every host's wall clock starts, in Unix milliseconds: far enough
/// from zero that a clock behind real time never goes below it.
pub const EPOCH_MS: u64 = 1_000_000;

/// One host's clock, relative to the simulation's real time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostClock {
    /// Constant offset from real time, milliseconds (negative: behind).
    pub skew_ms: i64,
    /// Rate error in parts per million (positive: runs fast).
    pub drift_ppm: i64,
    /// Steps ahead taken so far, milliseconds (a clock set forward).
    pub jumped_ms: u64,
    /// The host measures no peer's clock (its adverts' round trips fail):
    /// its verdict on its own clock is unknown.
    pub unmeasured: bool,
}

impl HostClock {
    /// The wall clock at `real_ms` of simulated real time.
    pub fn now_ms(&self, real_ms: u64) -> u64 {
        let real = i128::from(real_ms);
        let drift = real * i128::from(self.drift_ppm) / 1_000_000;
        let wall = i128::from(EPOCH_MS)
            + real
            + drift
            + i128::from(self.skew_ms)
            + i128::from(self.jumped_ms);
        u64::try_from(wall.max(0)).unwrap_or(u64::MAX)
    }
}

/// Every host's clock, shared by the driver and the hosts. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Clocks(Arc<Mutex<BTreeMap<NodeId, HostClock>>>);

impl Clocks {
    /// Clocks with these settings.
    pub fn new(clocks: BTreeMap<NodeId, HostClock>) -> Clocks {
        Clocks(Arc::new(Mutex::new(clocks)))
    }

    /// Host `node`'s wall clock at `real_ms` (real time for a host with no
    /// clock of its own).
    pub fn now_ms(&self, node: NodeId, real_ms: u64) -> u64 {
        self.host_clock(node).now_ms(real_ms)
    }

    /// Host `node`'s clock settings now (real time's for a host with no
    /// clock of its own).
    pub fn host_clock(&self, node: NodeId) -> HostClock {
        let clocks = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        clocks.get(&node).copied().unwrap_or_default()
    }

    /// Host `node`'s wall clock as the replica runtime reads it: a
    /// [`leasehold_replica::Clock`] whose source is this host's clock at the
    /// simulation's current time, so a journal built on it stamps what the
    /// host's clock says, skew, drift and jumps included (and a skew
    /// injected through the `Clock` applies on top). Outside a running
    /// simulation it reads the host's clock at real time zero.
    pub fn replica_clock(&self, node: NodeId) -> Clock {
        let clocks = self.clone();
        Clock::from_source(Arc::new(move || {
            let real_ms = turmoil::sim_elapsed().unwrap_or_default().as_millis();
            let wall_ms = clocks.now_ms(node, u64::try_from(real_ms).unwrap_or(u64::MAX));
            i64::try_from(wall_ms).unwrap_or(i64::MAX)
        }))
    }

    /// Whether host `node` measures its peers' clocks (see
    /// [`HostClock::unmeasured`]).
    pub fn set_unmeasured(&self, node: NodeId, unmeasured: bool) {
        let mut clocks = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        clocks.entry(node).or_default().unmeasured = unmeasured;
    }

    /// Sets host `node`'s clock `step_ms` further ahead.
    pub fn jump(&self, node: NodeId, step_ms: u64) {
        let mut clocks = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let clock = clocks.entry(node).or_default();
        clock.jumped_ms = clock.jumped_ms.saturating_add(step_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_is_real_time_shifted_stretched_and_stepped() {
        let clock = HostClock { skew_ms: -100, drift_ppm: 1_000, ..HostClock::default() };
        assert_eq!(clock.now_ms(0), EPOCH_MS - 100);
        // 1,000 ppm over 10 s is 10 ms fast.
        assert_eq!(clock.now_ms(10_000), EPOCH_MS + 10_000 + 10 - 100);
        let clocks = Clocks::new(BTreeMap::from([(2, clock)]));
        clocks.jump(2, 30_000);
        assert_eq!(clocks.now_ms(2, 10_000), EPOCH_MS + 40_000 + 10 - 100);
        assert_eq!(clocks.now_ms(1, 10_000), EPOCH_MS + 10_000, "no clock of its own: real time");
        // Outside a simulation the replica's view reads real time zero.
        assert_eq!(clocks.replica_clock(2).now_ms(), EPOCH_MS + 30_000 - 100);
    }
}
