//! Known bug classes the simulation can plant again, one switch each, so a
//! test can show the simulation finds them (issue: "planted bugs").
//!
//! A planted bug lives in the simulation's own layers — its disk, its state
//! machine's entry point, its driver's stamping — never in the shipped
//! crates: each one changes what the real code is *given* or *told* so that
//! the effect is exactly the bug's. docs/reliability.md lists how many seeds
//! each takes to be found.

use std::fmt;
use std::str::FromStr;

/// One bug class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// Ack ignores the fencing token: an ack of a job that has a lease
    /// applies as if it carried that lease's token, whatever it carried.
    AckWithoutTokenCheck,
    /// A node that takes a client's command stamps it with its own clock
    /// before forwarding it, and the leader keeps that time instead of
    /// stamping its own (planted in the driver: the write skips the
    /// leader's journal and goes to its Raft with the taker's stamp).
    FollowerStampsTime,
    /// The log store tells openraft an append is persisted as soon as it is
    /// written, before the sync that makes it durable.
    FlushBeforeSync,
    /// A new leader sweeps an earlier term's leases at their expiry, without
    /// the grace of the clock bound it owes them (another leader's clock
    /// stamped that expiry).
    SweepIgnoresBound,
}

impl Bug {
    /// Every bug class the simulation can plant.
    pub const ALL: [Bug; 4] = [
        Bug::AckWithoutTokenCheck,
        Bug::FollowerStampsTime,
        Bug::FlushBeforeSync,
        Bug::SweepIgnoresBound,
    ];

    /// The bug's name in `scripts/sim.sh --bug NAME` and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Bug::AckWithoutTokenCheck => "ack-without-token-check",
            Bug::FollowerStampsTime => "follower-stamps-time",
            Bug::FlushBeforeSync => "flush-before-sync",
            Bug::SweepIgnoresBound => "sweep-ignores-bound",
        }
    }
}

impl fmt::Display for Bug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no bug class.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown bug {0:?} (known: ack-without-token-check, follower-stamps-time, flush-before-sync, sweep-ignores-bound)"
)]
pub struct UnknownBug(String);

impl FromStr for Bug {
    type Err = UnknownBug;

    fn from_str(name: &str) -> Result<Bug, UnknownBug> {
        Bug::ALL.into_iter().find(|bug| bug.name() == name).ok_or_else(|| UnknownBug(name.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bug_parses_back_from_its_name() {
        for bug in Bug::ALL {
            assert_eq!(bug.name().parse::<Bug>().ok(), Some(bug));
        }
        assert!("no-such-bug".parse::<Bug>().is_err());
    }
}
