//! The network edge of a leasehold node: tonic services (Queue, Cluster and
//! the internal Raft service), the HTTP health endpoints, the one mapping from
//! [`Error`] to `tonic::Status`, and the [`Journal`] that proposes commands
//! (forwarding to the leader when this node is not it) and serves reads.

pub mod adverts;
pub mod auth;
pub mod bus;
pub mod clock;
pub mod cluster_service;
pub mod error;
pub mod faults_service;
pub mod forward;
pub mod gate;
pub mod http;
pub mod incoming;
pub mod journal;
pub mod limits;
pub mod metrics;
pub mod peer_service;
pub mod queue_service;
pub mod raft_service;
pub mod readiness;
pub mod schedules_service;

pub use clock::Clock;
pub use error::Error;
pub use gate::{Gate, GateConfig};
pub use journal::{Journal, JournalConfig};
pub use readiness::Readiness;
