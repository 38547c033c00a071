//! The serde envelope that carries openraft messages inside `RaftEnvelope`.
//!
//! Two layouts. **Binary** (the default between nodes that advertise it):
//! a version byte, [`BINARY_V1`], then the message in bincode with
//! fixed-width integers; trailing bytes and length prefixes past
//! [`MAX_ENVELOPE_BYTES`] are refused. **JSON**, what every earlier build
//! sends and reads: a JSON document, which never starts with that byte.
//! A reader accepts both and answers in the layout it was asked in, so a
//! node of an earlier build keeps working in a mixed cluster; a sender
//! uses binary only towards a peer whose adverts say it reads it
//! ([`PeerWires`]). A byte array in JSON is a list of decimal numbers,
//! four bytes on the wire for each byte of a payload, and slow to parse;
//! in binary it is a length and the bytes.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use bincode::Options;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::NodeId;

/// Largest envelope either side accepts. An append carries one entry
/// whatever its size, then more up to the log reader's byte budget; an
/// entry is at most the journal's batch bound (4 MiB, counting every
/// field) or one command (at most a Queue request, 16 MiB), and snapshots
/// travel in bounded chunks, so this is headroom.
pub const MAX_ENVELOPE_BYTES: usize = 64 * 1024 * 1024;

/// The first byte of a binary envelope (version 1). A JSON envelope starts
/// with `{`, `[`, a quote, a digit or white space, never with this.
pub const BINARY_V1: u8 = 0x01;

/// The newest peer wire this build reads and writes, as adverts carry it
/// (`Advert.wire_format`): 0 or absent, JSON envelopes only; 1, binary
/// envelopes too; 2, also the `AppendStream` call (appends on one
/// long-lived stream per follower, see [`crate::stream`]).
pub const WIRE_FORMAT: u32 = 2;

/// The first wire format whose nodes serve `AppendStream`.
pub const STREAM_FORMAT: u32 = 2;

/// How an envelope is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// A JSON document (every build reads it).
    Json,
    /// [`BINARY_V1`] and bincode.
    Binary,
}

impl Wire {
    /// The layout to send to a peer that advertised `wire_format`.
    pub fn for_format(wire_format: u32) -> Wire {
        if wire_format >= 1 { Wire::Binary } else { Wire::Json }
    }
}

/// Which wire format each peer reads, by its adverts; a peer not heard
/// from is sent JSON in unary calls, which every build reads.
#[derive(Clone, Debug, Default)]
pub struct PeerWires(Arc<RwLock<BTreeMap<NodeId, u32>>>);

impl PeerWires {
    /// The layout to send to `node`.
    pub fn of(&self, node: NodeId) -> Wire {
        Wire::for_format(self.format(node))
    }

    /// Whether `node` serves `AppendStream`.
    pub fn streams(&self, node: NodeId) -> bool {
        self.format(node) >= STREAM_FORMAT
    }

    fn format(&self, node: NodeId) -> u32 {
        match self.0.read() {
            Ok(map) => map.get(&node).copied().unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// Records what `node` advertised.
    pub fn set(&self, node: NodeId, wire_format: u32) {
        if let Ok(mut map) = self.0.write() {
            map.insert(node, wire_format);
        }
    }
}

/// Why an envelope could not be made or read. A JSON decode error names
/// the field it failed at (`vote.leader_id.term`), so a peer's malformed
/// message says what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("raft envelope{}: {source}", at(.path))]
pub struct EnvelopeError {
    path: String,
    source: Cause,
}

/// What went wrong in an envelope, by layout.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// A JSON envelope.
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// A binary envelope: malformed, trailing bytes, or over the size bound.
    #[error("binary envelope: {0}")]
    Binary(#[from] bincode::Error),
}

fn at(path: &str) -> String {
    if path.is_empty() { String::new() } else { format!(" at {path}") }
}

impl EnvelopeError {
    /// The field the decode failed at, dotted from the message's root
    /// (`vote.leader_id.term`); empty when the message as a whole is
    /// wrong (not JSON, or not an object), for binary envelopes, and when
    /// encoding failed.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What the codec said, without the path.
    pub fn cause(&self) -> &Cause {
        &self.source
    }
}

impl From<serde_json::Error> for EnvelopeError {
    fn from(source: serde_json::Error) -> Self {
        EnvelopeError { path: String::new(), source: Cause::Json(source) }
    }
}

impl From<bincode::Error> for EnvelopeError {
    fn from(source: bincode::Error) -> Self {
        EnvelopeError { path: String::new(), source: Cause::Binary(source) }
    }
}

fn binary() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_ENVELOPE_BYTES as u64)
        .reject_trailing_bytes()
}

/// Encodes a value for the wire as JSON (what a peer of any build reads).
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, EnvelopeError> {
    encode_as(Wire::Json, value)
}

/// Encodes a value for the wire in `wire`'s layout.
pub fn encode_as<T: Serialize>(wire: Wire, value: &T) -> Result<Vec<u8>, EnvelopeError> {
    match wire {
        Wire::Json => Ok(serde_json::to_vec(value)?),
        Wire::Binary => {
            let size = binary().serialized_size(value)?;
            let mut bytes =
                Vec::with_capacity(usize::try_from(size).unwrap_or(0).saturating_add(1));
            bytes.push(BINARY_V1);
            binary().serialize_into(&mut bytes, value)?;
            Ok(bytes)
        }
    }
}

/// Decodes a value from the wire; a malformed envelope is an error, never a default.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, EnvelopeError> {
    decode_with_wire(bytes).map(|(value, _)| value)
}

/// Decodes a value from the wire, and says which layout it came in (the
/// layout to answer in).
pub fn decode_with_wire<T: DeserializeOwned>(bytes: &[u8]) -> Result<(T, Wire), EnvelopeError> {
    if let Some((&BINARY_V1, message)) = bytes.split_first() {
        return Ok((binary().deserialize(message)?, Wire::Binary));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        // The root prints as `.`; a sequence index as `[2]`, after its field.
        let path = error.path().to_string();
        let path = if path == "." { String::new() } else { path };
        EnvelopeError { path, source: Cause::Json(error.into_inner()) }
    })?;
    // Trailing bytes after the value are malformed too.
    deserializer.end()?;
    Ok((value, Wire::Json))
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[test]
    fn a_million_nested_batches_are_refused_not_a_stack_overflow() -> std::io::Result<()> {
        use leasehold_core::Command;
        let one = Command::Batch { commands: vec![Command::Sweep] };
        let bytes = encode_as(Wire::Binary, &one).map_err(std::io::Error::other)?;
        // The version byte, the batch's variant and its list's length, then
        // the sweep: the opening repeated, made without any stack.
        let (opening, sweep) = bytes[1..].split_at(12);
        let mut nested = vec![BINARY_V1];
        nested.extend(opening.repeat(1_000_000));
        nested.extend_from_slice(sweep);
        // On a small stack: without the bound, following the nesting
        // overflows it and aborts the test process.
        let reader = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || decode::<Command>(&nested).map_err(|error| error.to_string()))?;
        let read = reader.join().map_err(|_| std::io::Error::other("the reader panicked"))?;
        assert!(read.as_ref().is_err_and(|e| e.contains("nested more than")), "{read:?}");
        Ok(())
    }

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

    fn message() -> Message {
        Message {
            leader: Leader { term: 3, node_id: 2 },
            entries: vec![Leader { term: 1, node_id: 1 }, Leader { term: 2, node_id: 3 }],
        }
    }

    #[test]
    fn a_binary_message_round_trips_and_says_its_layout() -> Result<(), EnvelopeError> {
        let bytes = encode_as(Wire::Binary, &message())?;
        assert_eq!(bytes.first(), Some(&BINARY_V1));
        assert_eq!(decode_with_wire::<Message>(&bytes)?, (message(), Wire::Binary));
        let json = encode_as(Wire::Json, &message())?;
        assert_eq!(decode_with_wire::<Message>(&json)?, (message(), Wire::Json));
        Ok(())
    }

    #[test]
    fn a_binary_envelope_with_trailing_bytes_or_cut_short_is_refused() -> Result<(), EnvelopeError>
    {
        let mut bytes = encode_as(Wire::Binary, &message())?;
        bytes.push(0);
        assert!(
            matches!(decode::<Message>(&bytes), Err(e) if matches!(e.cause(), Cause::Binary(_)))
        );
        bytes.truncate(bytes.len() - 2);
        assert!(decode::<Message>(&bytes).is_err(), "cut short");
        Ok(())
    }

    #[test]
    fn a_length_prefix_past_the_bound_is_refused_before_anything_is_allocated() {
        // Leader, then an entry count of 2^62: were it believed, the
        // decoder would reserve exabytes.
        let mut bytes = vec![BINARY_V1];
        bytes.extend_from_slice(&3u64.to_le_bytes());
        bytes.extend_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(decode::<Message>(&bytes).is_err());
    }

    #[test]
    fn a_payload_costs_its_bytes_in_binary_and_four_times_as_json() -> Result<(), EnvelopeError> {
        let payload = vec![200u8; 10_000];
        let binary = encode_as(Wire::Binary, &payload)?;
        let json = encode_as(Wire::Json, &payload)?;
        assert_eq!(binary.len(), 1 + 8 + 10_000);
        assert!(json.len() >= 4 * 10_000, "{} bytes of JSON", json.len());
        Ok(())
    }

    #[test]
    fn a_peer_not_heard_from_is_sent_json() {
        let wires = PeerWires::default();
        assert_eq!(wires.of(2), Wire::Json);
        wires.set(2, WIRE_FORMAT);
        wires.set(3, 0);
        wires.set(4, 1);
        assert_eq!(wires.of(2), Wire::Binary);
        assert_eq!(wires.of(3), Wire::Json, "an earlier build advertises no wire format");
        assert_eq!(wires.of(4), Wire::Binary);
        assert_eq!(
            [2, 3, 4, 5].map(|node| wires.streams(node)),
            [true, false, false, false],
            "only a peer advertising format 2 is sent appends on a stream"
        );
    }
}
