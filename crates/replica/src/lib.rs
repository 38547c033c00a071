//! The replica runtime of a leasehold node: everything between the gRPC
//! edge and the replicated state that is not pure decision.
//!
//! - [`journal`]: proposes commands to the Raft log, grouping concurrent
//!   proposals into one entry (the merge itself is `leasehold_core::batch`),
//!   forwards a follower's writes and read barriers to the leader, and
//!   serves reads from the local state machine;
//! - [`gate`]: the cutover gate's runtime — this node's flags, the peer
//!   registry fed by [`adverts`], the decision asked of core once per claim,
//!   and the broadcast claim path, [`bus`];
//! - [`clock`]: the node's wall clock (the system's, or an injected time
//!   source in a simulation), skewable for fault injection, and
//!   [`clock_watch`]: its measured offsets to peers and the enforced
//!   bound's verdict, which decides whether it may lead and stamp time;
//! - [`readiness`] and [`metrics`]: what `/readyz` and `/metrics` report;
//! - [`stores`]: what all of this uses of the node's two stores, as
//!   traits, so the journal runs on the node's stores and on the
//!   simulation's alike.
//!
//! It owns no listener and implements no gRPC service (that is the edge,
//! `leasehold-server`); it calls peers through `leasehold-raft`'s channels
//! and keeps its local tables through `leasehold-storage`. Errors are typed
//! ([`error::Unavailable`]) so the edge and the node branch on variants.

pub mod adverts;
pub mod bus;
pub mod clock;
pub mod clock_watch;
pub mod error;
pub mod forward;
pub mod gate;
pub mod journal;
pub mod metrics;
pub mod readiness;
pub mod stores;

pub use clock::Clock;
pub use error::{JournalError, Unavailable};
pub use gate::{Gate, GateConfig};
pub use journal::{Journal, JournalConfig};
pub use readiness::Readiness;
pub use stores::{ReplicaLogStore, ReplicaStateMachine, StoreError};
