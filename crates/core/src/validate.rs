//! Validation of every field a command carries, against [`crate::Limits`].
//! The server calls it before proposing (so bad input changes nothing and
//! gets a clear error) and `apply` calls it again with the default limits (so
//! a replica never trusts the proposer).

use serde::{Deserialize, Serialize};

/// Whether a field is malformed or merely too large; the server maps these to
/// `INVALID_ARGUMENT` and `RESOURCE_EXHAUSTED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ValidationKind {
    /// Malformed, empty or out of range.
    Invalid,
    /// Over a size limit.
    TooLarge,
}

/// A field that failed validation: `field` names it as the API does
/// (`jobs[3].queue`, `lease_ttl_ms`), `problem` says what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ValidationError {
    /// Kind of failure.
    pub kind: ValidationKind,
    /// Field path.
    pub field: String,
    /// Lower-case description of the problem.
    pub problem: String,
}
