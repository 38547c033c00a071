//! The serde envelope that carries openraft messages inside `RaftEnvelope`.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest envelope either side accepts. openraft sends log entries in
/// bounded batches and snapshots in bounded chunks, so this is headroom.
pub const MAX_ENVELOPE_BYTES: usize = 64 * 1024 * 1024;

/// Why an envelope could not be made or read.
#[derive(Debug, thiserror::Error)]
#[error("raft envelope: {0}")]
pub struct EnvelopeError(#[from] serde_json::Error);

/// Encodes a value for the wire.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, EnvelopeError> {
    Ok(serde_json::to_vec(value)?)
}

/// Decodes a value from the wire; a malformed envelope is an error, never a default.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, EnvelopeError> {
    Ok(serde_json::from_slice(bytes)?)
}
