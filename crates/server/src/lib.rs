//! The gRPC edge of a leasehold node: the public services (Queue,
//! Schedules, Cluster), the internal ones (Raft, Peer), health and the
//! status page over HTTP,
//! and what stands in front of them all — the listener that terminates TLS
//! and bounds connections ([`incoming`]), the one layer that says who may
//! call what ([`auth`]), the size limits ([`limits`]) — and the one mapping
//! from errors to gRPC status ([`error`]).
//!
//! Services validate a request once, then hand it to the replica runtime
//! (`leasehold-replica`); they decide nothing themselves beyond the edge's
//! own questions (is this field well formed, may this caller ask it).

pub mod auth;
pub mod cluster_service;
pub mod error;
pub mod faults_service;
pub mod health;
pub mod http;
pub mod incoming;
pub mod limits;
pub mod peer_service;
pub mod queue_service;
pub mod raft_service;
pub mod schedules_service;
pub mod status;

pub use error::Error;
