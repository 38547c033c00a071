//! The one mapping from service errors to gRPC status codes.

use leasehold_core::{Refusal, ValidationError, ValidationKind};
use leasehold_replica::{JournalError, Unavailable};

/// What a call can fail with. Messages are lower-case and name the field or
/// job concerned.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// Bad input; nothing changed.
    #[error("{0}")]
    Invalid(#[from] ValidationError),
    /// The fencing token presented is not the job's current one.
    #[error("stale fencing token {presented} for job {job_id}")]
    StaleToken {
        /// The job.
        job_id: u64,
        /// The token presented.
        presented: u64,
    },
    /// No such job or schedule; the message names it.
    #[error("{0}")]
    NotFound(String),
    /// Retryable: no quorum, no leader, draining; the variant says which.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A bug or a storage failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<JournalError> for Error {
    fn from(error: JournalError) -> Self {
        match error {
            JournalError::Unavailable(why) => Error::Unavailable(why),
            JournalError::Internal(message) | JournalError::PeerRefused(message) => {
                Error::Internal(message)
            }
        }
    }
}

impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::StaleToken { job_id, presented } => Error::StaleToken { job_id, presented },
            Refusal::NotFound { job_id } => Error::NotFound(format!("job {job_id} not found")),
            Refusal::ScheduleNotFound { name } => {
                Error::NotFound(format!("schedule {name:?} not found"))
            }
            Refusal::Invalid(invalid) => Error::Invalid(invalid),
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(error: Error) -> Self {
        let message = error.to_string();
        match error {
            Error::Invalid(ValidationError { kind: ValidationKind::Invalid, .. }) => {
                tonic::Status::invalid_argument(message)
            }
            Error::Invalid(ValidationError { kind: ValidationKind::TooLarge, .. }) => {
                tonic::Status::resource_exhausted(message)
            }
            Error::StaleToken { .. } => tonic::Status::failed_precondition(message),
            Error::NotFound(_) => tonic::Status::not_found(message),
            Error::Unavailable(_) => tonic::Status::unavailable(message),
            Error::Internal(_) => tonic::Status::internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_its_code() {
        let invalid = ValidationError {
            kind: ValidationKind::Invalid,
            field: "jobs[0].queue".into(),
            problem: "must not be empty".into(),
        };
        let too_large = ValidationError { kind: ValidationKind::TooLarge, ..invalid.clone() };
        let cases = [
            (Error::Invalid(invalid), tonic::Code::InvalidArgument),
            (Error::Invalid(too_large), tonic::Code::ResourceExhausted),
            (Error::StaleToken { job_id: 1, presented: 2 }, tonic::Code::FailedPrecondition),
            (Error::NotFound("job 1 not found".into()), tonic::Code::NotFound),
            (Error::Unavailable(Unavailable::Draining), tonic::Code::Unavailable),
            (Error::Unavailable(Unavailable::NoQuorum { timeout_ms: 5 }), tonic::Code::Unavailable),
            (Error::Internal("x".into()), tonic::Code::Internal),
        ];
        for (error, code) in cases {
            let status = tonic::Status::from(error);
            assert_eq!(status.code(), code, "{status:?}");
        }
    }

    #[test]
    fn invalid_message_names_the_field() {
        let status = tonic::Status::from(Error::Invalid(ValidationError {
            kind: ValidationKind::Invalid,
            field: "jobs[0].queue".into(),
            problem: "must not be empty".into(),
        }));
        assert_eq!(status.message(), "jobs[0].queue: must not be empty");
    }
}
