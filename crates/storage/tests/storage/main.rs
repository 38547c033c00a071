//! Integration tests of the stores, in one binary to keep link time low.
//!
//! - `conformance`: openraft's own storage suite over the stores.
//! - `reopen`: what was made durable comes back identical after the stores
//!   are dropped and the directory is opened again.
//! - `corruption`: damaged records are errors, never skipped.
//! - `crash`: durable writes survive the process exiting without cleanup.
//! - `disk_full`: a full disk fails the append as an error; a reopen keeps
//!   what was acknowledged.
//! - `power_cut`: what was acknowledged survives losing every unsynced write.
//! - `failpoint`: the test switch breaks every durable write, and only those.
//! - `reads`: bounded log reads keep to their entry and byte budgets.
//! - `migrate`: a data directory of the sled log opens migrated, once.
//! - `transfer`: a snapshot moves as chunks of files; a bad one changes
//!   nothing.

mod conformance;
mod corruption;
mod crash;
mod disk_full;
mod failpoint;
mod migrate;
mod power_cut;
mod reads;
mod reopen;
mod support;
mod transfer;
