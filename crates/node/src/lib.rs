//! The composition root of a leasehold node: configuration, wiring of
//! storage, Raft, services and HTTP, the leader-side driver (lease sweeps,
//! tombstone purges), and orderly shutdown.
//!
//! [`Node::start`] takes the listeners it serves on ([`Transport`]), so tests
//! bind port 0 and a simulation can pass its own.

pub mod config;
pub mod driver;
pub mod executor;
pub mod gate;
pub mod node;

pub use config::Config;
pub use node::{Node, NodeError, NodeHandle, Transport};
