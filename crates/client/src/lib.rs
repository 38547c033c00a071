//! A typed Rust client for leasehold with bounded retries, and a [`worker`]
//! loop that claims jobs, renews their leases while they run, and acks, nacks
//! or releases them.
//!
//! Any node serves any call (followers forward writes to the leader), so the
//! client needs one address.

pub mod client;
pub mod exec;
pub mod worker;

pub use client::{AuthChannel, Client, ClientBuilder, ClientError, ClientTls, RetryPolicy};
pub use worker::{Outcome, WorkerConfig, WorkerReport};
