//! Integration tests of the simulated disk, in one binary.
//!
//! - `conformance`: openraft's own storage suite over the simulated stores.
//! - `crash`: what the stores reported durable survives a crash; what they
//!   did not may be lost, torn, but never half-reported.
//! - `raft`: three openraft nodes on simulated disks survive a follower crash.

mod conformance;
mod crash;
mod raft;
