//! The replicated scheduler state and its deterministic `apply`.
//!
//! PUBLIC API CONTRACT (other crates call exactly these):
//!
//! ```ignore
//! #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
//! pub struct State { /* private; BTreeMaps only */ }
//! impl State {
//!     pub fn new() -> State;
//!     /// `epoch` = Raft term of the log entry carrying the proposal.
//!     pub fn apply(&mut self, epoch: u64, proposal: &Proposal) -> Response;
//!     pub fn cluster_time_ms(&self) -> u64;
//!     pub fn last_token(&self) -> u64;      // last fencing token issued (0 = none)
//!     pub fn last_job_id(&self) -> u64;     // last job id assigned (0 = none)
//!     pub fn job(&self, job_id: u64) -> Option<&Job>;
//!     /// Jobs with id > after_id matching the filter, ascending id, at most `limit`.
//!     pub fn jobs(&self, filter: &JobFilter, after_id: u64, limit: usize) -> Vec<&Job>;
//!     /// Per-queue counts; "due" judged at max(cluster time, now_ms).
//!     pub fn stats(&self, now_ms: u64) -> BTreeMap<String, QueueStats>;
//!     /// Whether a Claim at now_ms would grant anything (lets a long-poll avoid empty proposals).
//!     pub fn has_claimable(&self, queue: &str, selector: &[String], now_ms: u64) -> bool;
//!     /// Earliest not_before_ms of a ready, not-yet-due job in `queue`.
//!     pub fn next_due_ms(&self, queue: &str) -> Option<u64>;
//!     /// Earliest expires_at_ms of any current lease (drives Sweep).
//!     pub fn next_expiry_ms(&self) -> Option<u64>;
//!     /// Whether a Purge at now_ms would drop anything.
//!     pub fn has_purgeable(&self, now_ms: u64) -> bool;
//! }
//! #[derive(Clone, Debug, Default, PartialEq, Eq)]
//! pub struct JobFilter { pub queue: Option<String>, pub state: Option<JobState> }
//! ```
