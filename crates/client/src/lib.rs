//! A typed Rust client for leasehold with bounded retries, and a [`worker`]
//! loop that claims jobs, renews their leases while they run, and acks, nacks
//! or releases them. Each handler gets a [`LeaseGuard`]: the job, its
//! fencing token and epoch, the worker's deadline for the lease, and a
//! cancellation token that fires when the lease is lost or the worker
//! drains. docs/sdk.md is the guide; `examples/` has a producer, a fenced
//! worker and a cron scheduler.
//!
//! Any node serves any call (followers forward writes to the leader), so the
//! client needs one address; given several, it moves on when one is down
//! and follows leader hints. [`Client::builder`] adds TLS and a token.
//! [`Client::session`] opens a [`Session`]: the worker calls as frames on
//! one stream, for workers and producers that make many small calls. It
//! depends on the wire types only, never on the node's crates.

pub mod client;
pub mod exec;
pub mod guard;
pub mod session;
pub mod worker;

pub use client::{
    AuthChannel, Client, ClientBuilder, ClientError, ClientTls, Keepalive, RetryPolicy,
    new_request_id, refused_before_proposing,
};
pub use guard::{CancelReason, LeaseGuard};
pub use session::Session;
/// The token type of [`LeaseGuard::cancellation`], re-exported so users
/// need no dependency of their own.
pub use tokio_util::sync::CancellationToken;
pub use worker::{Outcome, WorkerConfig, WorkerReport};
