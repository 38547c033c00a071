//! A typed Rust client for leasehold with bounded retries, and a [`worker`]
//! loop that claims jobs, renews their leases while they run, and acks, nacks
//! or releases them.
//!
//! Any node serves any call (followers forward writes to the leader), so the
//! client needs one address; given several, it moves on when one is down
//! and follows leader hints. [`Client::builder`] adds TLS and a token. It
//! depends on the wire types only, never on the node's crates.

pub mod client;
pub mod exec;
pub mod worker;

pub use client::{AuthChannel, Client, ClientBuilder, ClientError, ClientTls, RetryPolicy};
pub use worker::{Outcome, WorkerConfig, WorkerReport};
