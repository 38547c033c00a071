//! Deterministic simulation of leasehold: a simulated disk, openraft's
//! network over turmoil ([`net`]), the node's own gRPC over turmoil
//! ([`grpc`]), and a seeded cluster run with faults and a workload
//! ([`cluster`]). What it covers and what not yet:
//! `docs/simulation.md`.
//!
//! [`SimDisk`] is one node's disk held in memory, with the durability
//! contract of the real store made explicit. Every write first lands in a
//! volatile view (what a running process reads back); only a sync makes it
//! durable. [`SimDisk::crash`] throws away every write after the last sync,
//! or, with [`Crash::Torn`], keeps an in-order prefix of them with the last
//! one cut short, the way a power cut leaves a log file. [`SimDisk::open`]
//! starts a new life of the node on what the disk holds.
//!
//! On it sit openraft's two storage traits over leasehold's own
//! [`TypeConfig`](leasehold_raft::TypeConfig):
//! - [`SimLogStore`] ([`openraft::storage::RaftLogStorage`]): appends are
//!   synced before openraft hears they are stored (by a flusher task, so a
//!   crash between the write and the sync is possible and observable), the
//!   vote, truncations and purges are synced before their call returns, the
//!   committed log id is written but not synced — the same rules as the
//!   sled store.
//! - [`SimStateMachine`] ([`openraft::storage::RaftStateMachine`]): applies
//!   entries with the real [`leasehold_core::State::apply`], keeps the live
//!   state in memory only, and syncs a snapshot before reporting it built
//!   or installed; a restart loads the last synced snapshot and openraft
//!   re-applies the log from there.
//!
//! Both pass openraft's storage `Suite`, like the sled store, and both
//! implement the replica runtime's store traits
//! ([`leasehold_replica::stores`]), so the real
//! [`Journal`](leasehold_replica::Journal) runs on them. Handles of an
//! earlier life (a crashed node's tasks still running in the same process)
//! fail every call with [`SimDiskError::Stale`] instead of writing into the
//! next life's disk.
//!
//! ```
//! # async fn demo() {
//! use leasehold_sim::{Crash, SimDisk};
//! let disk = SimDisk::new();
//! let (_log_store, _state_machine) = disk.open();
//! // ... run a node on them ...
//! disk.crash(Crash::LoseUnsynced);
//! let (_log_store, _state_machine) = disk.open(); // recovers what was synced
//! # }
//! ```

pub mod bugs;
pub mod clock;
pub mod cluster;
mod disk;
mod error;
pub mod grpc;
pub mod local;
mod log_store;
pub mod net;
mod state_machine;

pub use bugs::Bug;

/// openraft's settings for a simulated node: heartbeats every 50 ms and an
/// election window one millisecond wide from `election_min`, so openraft's
/// draw of the timeout (`gen_range(min..max)` on a generator seeded from
/// the operating system) has one possible value and the caller's choice of
/// `election_min` (distinct per node, or drawn from the seed) decides
/// everything. Not validated; callers add what their run needs.
pub fn raft_config(election_min: u64) -> openraft::Config {
    openraft::Config {
        heartbeat_interval: 50,
        election_timeout_min: election_min,
        election_timeout_max: election_min + 1,
        ..openraft::Config::default()
    }
}
pub use disk::{Crash, SimDisk};
pub use error::SimDiskError;
pub use log_store::SimLogStore;
pub use state_machine::SimStateMachine;
