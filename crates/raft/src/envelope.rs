//! The serde envelope that carries openraft messages inside `RaftEnvelope`.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest envelope either side accepts. openraft sends log entries in
/// bounded batches and snapshots in bounded chunks, so this is headroom.
pub const MAX_ENVELOPE_BYTES: usize = 64 * 1024 * 1024;

/// Why an envelope could not be made or read. A decode error names the
/// field it failed at (`vote.leader_id.term`), so a peer's malformed
/// message says what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("raft envelope{}: {source}", at(.path))]
pub struct EnvelopeError {
    path: String,
    source: serde_json::Error,
}

fn at(path: &str) -> String {
    if path.is_empty() { String::new() } else { format!(" at {path}") }
}

impl EnvelopeError {
    /// The field the decode failed at, dotted from the message's root
    /// (`vote.leader_id.term`); empty when the message as a whole is
    /// wrong (not JSON, or not an object) or when encoding failed.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What serde said, without the path.
    pub fn cause(&self) -> &serde_json::Error {
        &self.source
    }
}

impl From<serde_json::Error> for EnvelopeError {
    fn from(source: serde_json::Error) -> Self {
        EnvelopeError { path: String::new(), source }
    }
}

/// Encodes a value for the wire.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, EnvelopeError> {
    Ok(serde_json::to_vec(value)?)
}

/// Decodes a value from the wire; a malformed envelope is an error, never a default.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, EnvelopeError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        // The root prints as `.`; a sequence index as `[2]`, after its field.
        let path = error.path().to_string();
        let path = if path == "." { String::new() } else { path };
        EnvelopeError { path, source: error.into_inner() }
    })?;
    // Trailing bytes after the value are malformed too.
    deserializer.end()?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct Leader {
        term: u64,
        node_id: u64,
    }

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct Message {
        leader: Leader,
        entries: Vec<Leader>,
    }

    #[test]
    fn a_message_round_trips() -> Result<(), EnvelopeError> {
        let message = Message {
            leader: Leader { term: 3, node_id: 2 },
            entries: vec![Leader { term: 1, node_id: 1 }],
        };
        assert_eq!(decode::<Message>(&encode(&message)?)?, message);
        Ok(())
    }

    #[test]
    fn a_decode_error_names_the_field() {
        let cases: [(&[u8], &str); 5] = [
            (br#"{"leader":{"term":"one","node_id":2},"entries":[]}"#, "leader.term"),
            (
                br#"{"leader":{"term":1,"node_id":2},"entries":[{"term":1,"node_id":-1}]}"#,
                "entries[0].node_id",
            ),
            (br#"{"leader":{"term":1,"node_id":2},"entries":5}"#, "entries"),
            (br#"{"leader":{"term":1}}"#, "leader"),
            (b"not json", ""),
        ];
        for (bytes, path) in cases {
            match decode::<Message>(bytes) {
                Ok(message) => panic!("{bytes:?} decoded to {message:?}"),
                Err(error) => assert_eq!(error.path(), path, "{error}"),
            }
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let bytes = br#"{"leader":{"term":1,"node_id":2},"entries":[]} junk"#;
        assert!(decode::<Message>(bytes).is_err());
    }
}
