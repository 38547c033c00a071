//! What the Raft log keeps in raft-log's write-ahead log, and how: the
//! [`raft_log::Types`] binding, the record codec, the format marker and the
//! flush callback.
//!
//! Every value goes through the crate's one codec (bincode, trailing bytes
//! refused), framed as a length-prefixed byte string (the length checked by
//! its complement, so damage is told from a torn tail: [`decode_bytes`])
//! inside a raft-log record that carries its own CRC32. A record whose
//! bytes do not decode is an error naming the value, never a default.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use leasehold_raft::{NodeId, TypeConfig};
use openraft::storage::LogFlushed;
use openraft::{Entry, LogId, Vote};
use raft_log::codeq::{Decode, Encode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::codec::{decode, encode};

/// The raft-log binding for leasehold's Raft group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct LogTypes;

impl raft_log::Types for LogTypes {
    type LogId = Stored<LogId<NodeId>>;
    type LogPayload = StoredEntry;
    type Vote = Stored<Vote<NodeId>>;
    type UserData = Stored<LogFormat>;
    type Callback = Flushed;

    fn log_index(log_id: &Self::LogId) -> u64 {
        log_id.0.index
    }

    fn payload_size(payload: &Self::LogPayload) -> u64 {
        payload.encoded_bytes
    }
}

/// A value stored in the log through the crate's codec. Ordering is the
/// value's own (openraft's order of log ids and votes, which raft-log uses
/// to refuse a vote or a log id that goes backwards).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Stored<T>(pub(crate) T);

impl<T: Serialize> Encode for Stored<T> {
    fn encode<W: io::Write>(&self, w: W) -> Result<usize, io::Error> {
        encode_bytes(&to_bytes(&self.0)?, w)
    }
}

impl<T: DeserializeOwned> Decode for Stored<T> {
    fn decode<R: io::Read>(r: R) -> Result<Self, io::Error> {
        let bytes = decode_bytes(r)?;
        from_bytes(&bytes).map(Stored)
    }
}

/// A log entry as the log holds it: shared, so the payload cache and a
/// reader hold it without copying, and with its encoded size, which bounds
/// the cache and the byte budget of a bounded read.
#[derive(Clone, Debug)]
pub(crate) struct StoredEntry {
    pub(crate) entry: Arc<Entry<TypeConfig>>,
    pub(crate) encoded_bytes: u64,
}

impl StoredEntry {
    /// Wraps `entry`, measuring its encoding.
    pub(crate) fn new(entry: Entry<TypeConfig>) -> Result<Self, crate::StorageError> {
        let encoded_bytes = crate::codec::encoded_len("log entry", &entry)?;
        // A record's value is at most MAX_RECORD_VALUE_BYTES (what reading
        // takes back); checked here so that encoding inside raft-log, which
        // would leave half a record in its buffer, cannot fail.
        if encoded_bytes > u64::from(MAX_RECORD_VALUE_BYTES) {
            return Err(crate::StorageError::Encode {
                what: "log entry",
                source: Box::new(bincode::ErrorKind::SizeLimit),
            });
        }
        Ok(StoredEntry { entry: Arc::new(entry), encoded_bytes })
    }
}

impl Encode for StoredEntry {
    fn encode<W: io::Write>(&self, w: W) -> Result<usize, io::Error> {
        encode_bytes(&to_bytes(self.entry.as_ref())?, w)
    }
}

impl Decode for StoredEntry {
    fn decode<R: io::Read>(r: R) -> Result<Self, io::Error> {
        let bytes = decode_bytes(r)?;
        let entry: Entry<TypeConfig> = from_bytes(&bytes)?;
        Ok(StoredEntry { entry: Arc::new(entry), encoded_bytes: bytes.len() as u64 })
    }
}

/// Written into the log's own state (raft-log's user data) when the log is
/// created, and kept by every later checkpoint: a log that carries it is
/// complete. A directory without it is a creation or a migration that did
/// not finish, and is made again (see `migrate`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogFormat {
    /// The layout version of what this log stores; 1 is bincode entries,
    /// log ids and votes as above.
    pub(crate) version: u32,
    /// How many entries were copied from an older version's sled trees
    /// when this log was made (`None`: it started empty).
    pub(crate) migrated_entries: Option<u64>,
}

/// The layout version this build writes.
pub(crate) const LOG_FORMAT_VERSION: u32 = 1;

/// Strict bincode of `value`, as an I/O error when it cannot be encoded.
fn to_bytes<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, io::Error> {
    encode("raft log record", value)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidInput, error_chain(&error)))
}

/// Decodes strict bincode; a failure is `InvalidData`, which raft-log
/// reports as a damaged record.
fn from_bytes<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, io::Error> {
    decode::<T>("raft log", "record", bytes)
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error_chain(&error)))
}

/// The longest value a record can hold: an entry came in one Raft envelope
/// (or was proposed within the request limits, which are smaller), and a
/// vote or a log id is a few dozen bytes.
const MAX_RECORD_VALUE_BYTES: u32 = 64 * 1024 * 1024;

/// The first byte of a value written by this build: its length follows,
/// then the length's bitwise complement (see [`encode_bytes`]). Values of
/// earlier builds start with their length's high byte, which is at most
/// `0x04` (no value is over [`MAX_RECORD_VALUE_BYTES`]).
const CHECKED_LENGTH: u8 = 0xC3;

/// Reads what [`encode_bytes`] wrote, or what an earlier build wrote (a
/// bare `u32` length). A length that disagrees with its complement, or one
/// past any value a record can hold, is damage (`InvalidData`), never a
/// record cut short by a crash: the log treats a short read at the end of
/// its newest file as a torn tail and cuts the file there, so a damaged
/// length read as "the rest of the file" would silently drop every synced
/// record after it, a vote included. Only a value whose length checks out
/// and runs past the end (or a header cut short) is a torn tail.
fn decode_bytes<R: io::Read>(mut r: R) -> Result<Vec<u8>, io::Error> {
    let damaged = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    let mut first = [0u8; 1];
    r.read_exact(&mut first)?;
    let length = match first[0] {
        CHECKED_LENGTH => {
            let mut header = [0u8; 8];
            r.read_exact(&mut header)?;
            let [a, b, c, d, e, f, g, h] = header;
            let length = u32::from_be_bytes([a, b, c, d]);
            let check = u32::from_be_bytes([e, f, g, h]);
            if check != !length {
                return Err(damaged(format!(
                    "a record's length reads {length} bytes but its check reads {}",
                    !check
                )));
            }
            length
        }
        high => {
            // A value of an earlier build: a bare big-endian length.
            let mut rest = [0u8; 3];
            r.read_exact(&mut rest)?;
            let [b, c, d] = rest;
            u32::from_be_bytes([high, b, c, d])
        }
    };
    if length > MAX_RECORD_VALUE_BYTES {
        return Err(damaged(format!(
            "a record's length reads {length} bytes, more than any record holds"
        )));
    }
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut r.take(u64::from(length)), &mut bytes)?;
    if bytes.len() < length as usize {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a record cut short"));
    }
    Ok(bytes)
}

/// Writes `bytes` as [`CHECKED_LENGTH`], its length as a big-endian `u32`,
/// that length's bitwise complement, then the bytes: one damaged bit of
/// the length is told from a torn tail ([`decode_bytes`]). A value longer
/// than [`MAX_RECORD_VALUE_BYTES`] is refused, as reading it back would be.
fn encode_bytes<W: io::Write>(bytes: &[u8], mut w: W) -> Result<usize, io::Error> {
    let length = u32::try_from(bytes.len())
        .ok()
        .filter(|length| *length <= MAX_RECORD_VALUE_BYTES)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("raft log record of {} bytes, limit {MAX_RECORD_VALUE_BYTES}", bytes.len()),
            )
        })?;
    w.write_all(&[CHECKED_LENGTH])?;
    w.write_all(&length.to_be_bytes())?;
    w.write_all(&(!length).to_be_bytes())?;
    w.write_all(bytes)?;
    Ok(9 + bytes.len())
}

/// An error and its causes on one line, for an `io::Error` message that
/// must carry them (raft-log keeps only the message of what it is given).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The first write failure the log's flush worker reported, shared by every
/// clone of the store: after it the worker has stopped (raft-log does not
/// resume after a failed write or fsync), so every later write is refused
/// with it and the readiness probe fails until the node restarts.
#[derive(Debug, Default)]
pub(crate) struct Health {
    failure: Mutex<Option<String>>,
    /// Who hears how long each append took to be synced (set once).
    pub(crate) syncs: SyncTimer,
    /// Test-only: how much later than its sync an append is reported
    /// synced, in microseconds (0: at once). See `LogStore::set_sync_delay`.
    pub(crate) sync_delay_us: std::sync::atomic::AtomicU64,
}

/// Told how long an append took from its hand-over to the flush worker
/// until its entries were synced (the `log_sync` stage of a commit round).
pub type SyncObserver = Arc<dyn Fn(std::time::Duration) + Send + Sync>;

/// The [`SyncObserver`] of a store, if one was set.
#[derive(Default)]
pub(crate) struct SyncTimer(std::sync::OnceLock<SyncObserver>);

impl SyncTimer {
    /// Sets the observer; the first call wins.
    pub(crate) fn set(&self, observer: SyncObserver) {
        let _ = self.0.set(observer);
    }

    fn observe(&self, elapsed: std::time::Duration) {
        if let Some(observe) = self.0.get() {
            observe(elapsed);
        }
    }
}

impl std::fmt::Debug for SyncTimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncTimer").field("set", &self.0.get().is_some()).finish()
    }
}

impl Health {
    /// Records `error` unless an earlier failure is already recorded.
    pub(crate) fn fail(&self, error: &io::Error) {
        let mut failure = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if failure.is_none() {
            *failure = Some(error.to_string());
        }
    }

    /// The first failure, if any.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// What the flush worker calls once a flush is on stable storage (or
/// failed): openraft's callback for an append, or a waiting store method.
pub(crate) struct Flushed {
    /// `None` once answered.
    waiter: Option<Waiter>,
    health: Arc<Health>,
}

enum Waiter {
    /// An append (handed to the worker at the instant it carries):
    /// openraft counts the entries stored only when this fires.
    Append(LogFlushed<TypeConfig>, std::time::Instant),
    /// A vote, truncate, purge, probe or migration waiting for its sync.
    Done(tokio::sync::oneshot::Sender<io::Result<()>>),
    /// A blocking caller (opening and migrating run outside a runtime).
    Blocking(std::sync::mpsc::SyncSender<io::Result<()>>),
}

impl Flushed {
    /// Reports to openraft when the entries of an append are durable.
    pub(crate) fn append(callback: LogFlushed<TypeConfig>, health: Arc<Health>) -> Self {
        Flushed { waiter: Some(Waiter::Append(callback, std::time::Instant::now())), health }
    }

    /// Reports to an awaiting caller; answers the receiver to await.
    pub(crate) fn done(
        health: Arc<Health>,
    ) -> (Self, tokio::sync::oneshot::Receiver<io::Result<()>>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (Flushed { waiter: Some(Waiter::Done(tx)), health }, rx)
    }

    /// Reports to a blocking caller; answers the receiver to wait on.
    pub(crate) fn blocking(
        health: Arc<Health>,
    ) -> (Self, std::sync::mpsc::Receiver<io::Result<()>>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        (Flushed { waiter: Some(Waiter::Blocking(tx)), health }, rx)
    }
}

impl std::fmt::Debug for Flushed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.waiter {
            Some(Waiter::Append(..)) => "append",
            Some(Waiter::Done(_)) => "done",
            Some(Waiter::Blocking(_)) => "blocking",
            None => "answered",
        };
        f.debug_struct("Flushed").field("waiter", &kind).finish()
    }
}

impl raft_log::Callback for Flushed {
    fn send(mut self, result: Result<(), io::Error>) {
        if let Some(waiter) = self.waiter.take() {
            answer(waiter, &self.health, result);
        }
    }
}

/// The flush worker drops the requests still queued when it stops (a write
/// failed): their waiters are answered with an error here rather than left
/// with a closed channel, and the store stops taking writes. The worker's
/// own error (a full disk, say) is logged by raft-log as `FlushWorker
/// failed`, and the next write to the store names it.
impl Drop for Flushed {
    fn drop(&mut self) {
        if let Some(waiter) = self.waiter.take() {
            let stopped = io::Error::other(
                "the raft log's flush worker stopped before this write was synced",
            );
            answer(waiter, &self.health, Err(stopped));
        }
    }
}

/// Tells `waiter` how its flush ended.
fn answer(waiter: Waiter, health: &Health, result: Result<(), io::Error>) {
    if let Err(error) = &result {
        health.fail(error);
    }
    match waiter {
        Waiter::Append(callback, handed_over) => {
            let delay_us = health.sync_delay_us.load(std::sync::atomic::Ordering::Relaxed);
            if delay_us > 0 {
                // A slow disk, as a test asks for: the flush worker
                // stalls with it, as it would on the device.
                std::thread::sleep(std::time::Duration::from_micros(delay_us));
            }
            if result.is_ok() {
                health.syncs.observe(handed_over.elapsed());
            }
            callback.log_io_completed(result)
        }
        // A waiter that went away (its task was cancelled) needs no answer.
        Waiter::Done(tx) => {
            let _ = tx.send(result);
        }
        Waiter::Blocking(tx) => {
            let _ = std::sync::mpsc::SyncSender::send(&tx, result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_values_round_trip_and_refuse_damage() -> anyhow::Result<()> {
        let log_id = LogId::new(openraft::CommittedLeaderId::new(3, 1), 9);
        let mut bytes = Vec::new();
        let written = Stored(log_id).encode(&mut bytes)?;
        assert_eq!(written, bytes.len());
        assert_eq!(Stored::<LogId<NodeId>>::decode(&bytes[..])?, Stored(log_id));

        // An earlier build's frame (a bare length) still reads.
        let value = bytes[9..].to_vec();
        let mut bare = (value.len() as u32).to_be_bytes().to_vec();
        bare.extend_from_slice(&value);
        assert_eq!(Stored::<LogId<NodeId>>::decode(&bare[..])?, Stored(log_id));

        // One flipped bit of the length, or of its check, is damage, not
        // a torn tail, wherever the length would then end.
        for (at, bit) in [(4, 0x01), (3, 0x10), (2, 0x01), (1, 0x80), (8, 0x04)] {
            let mut damaged = bytes.clone();
            damaged[at] ^= bit;
            let error = Stored::<LogId<NodeId>>::decode(&damaged[..]).expect_err("damaged");
            assert_eq!(error.kind(), io::ErrorKind::InvalidData, "byte {at} ^ {bit:#x}");
        }
        // A header cut short is a torn tail.
        let error = Stored::<LogId<NodeId>>::decode(&bytes[..6]).expect_err("header cut");
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);

        // One byte more inside the frame: trailing bytes are refused.
        let mut padded = value;
        padded.push(0);
        let mut framed = (padded.len() as u32).to_be_bytes().to_vec();
        framed.extend_from_slice(&padded);
        let error = Stored::<LogId<NodeId>>::decode(&framed[..]).expect_err("trailing byte");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);

        // A frame cut short is an incomplete record (raft-log's torn tail).
        let error = Stored::<LogId<NodeId>>::decode(&bytes[..bytes.len() - 1]).expect_err("cut");
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        Ok(())
    }

    #[test]
    fn a_stored_entry_knows_its_encoded_size() -> anyhow::Result<()> {
        let entry = Entry::<TypeConfig> {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), 4),
            payload: openraft::EntryPayload::Blank,
        };
        let stored = StoredEntry::new(entry.clone())?;
        let mut bytes = Vec::new();
        stored.encode(&mut bytes)?;
        assert_eq!(stored.encoded_bytes + 9, bytes.len() as u64);
        let back = StoredEntry::decode(&bytes[..])?;
        assert_eq!(*back.entry, entry);
        assert_eq!(back.encoded_bytes, stored.encoded_bytes);
        Ok(())
    }
}
