//! Pure domain logic of leasehold: jobs, leases, fencing tokens, the command
//! set and its deterministic [`State::apply`], and input validation.
//!
//! Nothing here performs IO, spawns tasks or reads a clock. Time enters as
//! data: every [`Proposal`] carries the proposer's wall-clock `now_ms`, and the
//! state keeps *cluster time*, the maximum `now_ms` it has seen, so time never
//! runs backwards across leader changes.
//!
//! ```text
//!   client ──► server (validate) ──► Raft log: Proposal{now_ms, Command}
//!                                          │ committed, in log order
//!                                          ▼
//!                         State::apply(epoch, &Proposal) -> Response
//!                                          │ identical on every replica
//!                                          ▼
//!                         Response back to the proposer (grant, refusal, …)
//! ```
//!
//! Refusals (a stale token, an unknown job) are [`Response::Refused`] values
//! that replicate like any other response; they are not errors.
//!
//! Where things live: [`command`] is the journal's vocabulary, [`state`]
//! applies it (with private indexes so a claim or a sweep never scans every
//! job), [`validate`] checks every field against [`Limits`] — the server
//! calls [`validate_command`] before proposing and `apply` calls it again —
//! and [`response`] is what comes back. [`batch`] merges several
//! proposers' commands into one log entry and splits its answer back;
//! `State`'s queries answer the node's read-only questions (the leases a
//! holder has, the members a `target = each` tick goes to), so those
//! decisions live here too. Most of the crate's tests are unit
//! tests beside `state` and `validate`, plus property tests in
//! `tests/properties.rs` that drive random command sequences (with clocks
//! running backwards) and check the fencing and replication guarantees
//! after every step.

pub mod batch;
pub mod bus;
pub mod claim_path;
pub mod clock_bound;
pub mod command;
pub mod cron;
mod id_set;
mod index;
pub mod job;
mod jobs;
pub mod lease;
pub mod limits;
mod live_table;
pub mod nesting;
pub mod node_info;
pub mod response;
pub mod schedule;
pub mod state;
mod tomb_table;
pub mod validate;

pub use command::{Command, Proposal, RedriveTarget};
pub use job::{Backoff, Job, JobSpec, JobState};
pub use lease::Lease;
pub use limits::Limits;
pub use response::{EnqueueOutcome, Grant, QueueStats, Refusal, Response};
pub use state::{JobFilter, State};
pub use validate::{ValidationError, ValidationKind, validate_command};
