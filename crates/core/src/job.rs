//! Jobs: what a producer enqueues ([`JobSpec`]) and what the journal keeps
//! ([`Job`]).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::lease::Lease;

/// Where a job is in its life: `Ready → Claimed → Acked`, `Claimed → Ready`
/// (nack with retry, lease expiry, release), and `→ Dead` once attempts reach
/// `max_attempts`. A job whose lease a sweep took back goes `Ready → Acked`
/// or `Dead → Acked` when the ack under that lease comes late, before the
/// job is granted again (log format 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum JobState {
    /// Waiting to be claimed (possibly not yet due: see `not_before_ms`).
    Ready,
    /// Held by one worker under a lease.
    Claimed,
    /// Done; kept as a tombstone until retention passes.
    Acked,
    /// Failed `max_attempts` times; waits for a redrive (or a late ack
    /// under the lease whose lapse killed it).
    Dead,
}

impl JobState {
    /// Lower-case name used on the wire and in the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Ready => "ready",
            JobState::Claimed => "claimed",
            JobState::Acked => "acked",
            JobState::Dead => "dead",
        }
    }
}

/// Exponential retry delay, jitter-free so `apply` stays deterministic:
/// the n-th failed attempt (1-based) waits `min(cap_ms, base_ms * 2^(n-1))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base_ms: u64,
    /// Upper bound of any delay.
    pub cap_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base_ms: 1_000, cap_ms: 300_000 }
    }
}

impl Backoff {
    /// Delay before the retry that follows failed attempt number `attempt`
    /// (1-based): `min(cap_ms, base_ms * 2^(attempt-1))`, saturating, so a
    /// job with a thousand attempts waits `cap_ms` rather than overflowing.
    /// Attempt 0 is treated as attempt 1.
    pub fn delay_ms(&self, attempt: u32) -> u64 {
        let doublings = attempt.saturating_sub(1);
        // 2^64 and beyond saturate: shifting by 64 or more is not defined.
        let factor = 1u64.checked_shl(doublings).unwrap_or(u64::MAX);
        self.base_ms.saturating_mul(factor).min(self.cap_ms)
    }
}

/// What a producer asks to enqueue. Optional fields take the defaults of
/// [`crate::Limits`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Queue name: `[a-z0-9][a-z0-9._-]{0,63}`.
    pub queue: String,
    /// Opaque bytes handed to the worker.
    pub payload: Vec<u8>,
    /// Higher is claimed first.
    pub priority: i32,
    /// Cluster time before which the job is not claimable; `None` = now.
    pub not_before_ms: Option<u64>,
    /// Attempts before the job is dead; `None` = default (5).
    pub max_attempts: Option<u32>,
    /// Retry delay; `None` = default.
    pub backoff: Option<Backoff>,
    /// Lease length for claims that do not name one; `None` = default (30 s).
    pub lease_ttl_ms: Option<u64>,
    /// Dedup key within the queue.
    pub idempotency_key: Option<String>,
    /// Only workers whose selector includes every tag may claim the job.
    pub tags: Vec<String>,
}

/// A job as the journal keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    /// Assigned by the state machine, strictly increasing.
    pub id: u64,
    /// Queue name.
    pub queue: String,
    /// Opaque bytes handed to the worker.
    pub payload: Vec<u8>,
    /// Higher is claimed first.
    pub priority: i32,
    /// Cluster time before which the job is not claimable.
    pub not_before_ms: u64,
    /// Attempts before the job is dead.
    pub max_attempts: u32,
    /// Retry delay.
    pub backoff: Backoff,
    /// Default lease length for this job.
    pub lease_ttl_ms: u64,
    /// Dedup key within the queue.
    pub idempotency_key: Option<String>,
    /// Tags a worker's selector must include (sorted, deduplicated).
    pub tags: Vec<String>,
    /// Failed attempts so far (nacks and lease expiries).
    pub attempts: u32,
    /// Error text of the last failed attempt.
    pub last_error: Option<String>,
    /// Where the job is in its life.
    pub state: JobState,
    /// The current lease while `Claimed` (kept after expiry until swept or
    /// re-granted), the lease that finished an `Acked` job, and on a
    /// `Ready` or `Dead` job the lease a sweep took back, kept so an ack
    /// under it still counts until the job is granted again or redriven
    /// (reads do not show that one).
    pub lease: Option<Lease>,
    /// Cluster time of the enqueue.
    pub enqueued_at_ms: u64,
    /// Cluster time the job became acked or dead.
    pub finished_at_ms: Option<u64>,
    /// What the ack that finished the job reported (a command's output).
    pub result: Option<Vec<u8>>,
}

/// Attempts a job gets when neither it nor the leader's limits said
/// otherwise: a job with these is stored without its [`Rare`] part. Only a
/// compression dictionary for the in-memory form; nothing replicated or
/// written depends on it.
const COMMON_MAX_ATTEMPTS: u32 = 5;
/// Lease length stored without a [`Rare`] part (see [`COMMON_MAX_ATTEMPTS`]).
const COMMON_LEASE_TTL_MS: u64 = 30_000;

/// A job as the state keeps it in memory: what every ready job has, in as
/// few bytes as will hold it, and everything most jobs leave at its default
/// in one optional boxed [`Rare`] part. The queue name is shared with the
/// queue's index (one allocation per queue, not per job). Converted to and
/// from [`Job`] ([`StoredJob::to_job`], [`StoredJob::from_job`]); snapshots
/// write the [`Job`] form, so the format on disk and on the wire is
/// unchanged. The id is the key it is stored under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredJob {
    /// Queue name, shared with the other jobs of the queue.
    pub(crate) queue: Arc<str>,
    /// Opaque bytes handed to the worker.
    pub(crate) payload: Box<[u8]>,
    /// Cluster time before which the job is not claimable.
    pub(crate) not_before_ms: u64,
    /// Cluster time of the enqueue.
    pub(crate) enqueued_at_ms: u64,
    /// Higher is claimed first.
    pub(crate) priority: i32,
    /// Failed attempts so far.
    pub(crate) attempts: u32,
    /// Where the job is in its life.
    pub(crate) state: JobState,
    /// Everything else, when any of it differs from [`Rare::default`].
    rare: Option<Box<Rare>>,
}

/// The fields of a [`Job`] that most jobs leave at a common value. A job
/// that has run keeps its outcome here (a tombstone's lease and finish
/// time): texts and bytes as boxed slices, and the settings a producer
/// rarely changes boxed once more, so a default job's tombstone carries
/// 120 bytes here, not the 208 of a flat [`Job`] tail.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rare {
    settings: Option<Box<Settings>>,
    last_error: Option<Box<str>>,
    lease: Option<Lease>,
    finished_at_ms: Option<u64>,
    result: Option<Box<[u8]>>,
}

/// The settings of a [`Job`] that a producer rarely changes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Settings {
    max_attempts: u32,
    backoff: Backoff,
    lease_ttl_ms: u64,
    idempotency_key: Option<Box<str>>,
    tags: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_attempts: COMMON_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            lease_ttl_ms: COMMON_LEASE_TTL_MS,
            idempotency_key: None,
            tags: Vec::new(),
        }
    }
}

/// The [`Rare`] part every job without one has.
static COMMON: std::sync::LazyLock<Rare> = std::sync::LazyLock::new(Rare::default);
/// The [`Settings`] every job without its own has.
static COMMON_SETTINGS: std::sync::LazyLock<Settings> = std::sync::LazyLock::new(Settings::default);

impl StoredJob {
    /// The stored form of `job`, naming its queue by `queue` (equal to
    /// `job.queue`; shared so that a queue's name is allocated once).
    pub(crate) fn from_job(job: Job, queue: Arc<str>) -> StoredJob {
        let settings = Settings {
            max_attempts: job.max_attempts,
            backoff: job.backoff,
            lease_ttl_ms: job.lease_ttl_ms,
            idempotency_key: job.idempotency_key.map(String::into_boxed_str),
            tags: job.tags,
        };
        let rare = Rare {
            settings: (settings != *COMMON_SETTINGS).then(|| Box::new(settings)),
            last_error: job.last_error.map(String::into_boxed_str),
            lease: job.lease,
            finished_at_ms: job.finished_at_ms,
            result: job.result.map(Vec::into_boxed_slice),
        };
        StoredJob {
            queue,
            payload: job.payload.into_boxed_slice(),
            not_before_ms: job.not_before_ms,
            enqueued_at_ms: job.enqueued_at_ms,
            priority: job.priority,
            attempts: job.attempts,
            state: job.state,
            rare: (rare != *COMMON).then(|| Box::new(rare)),
        }
    }

    /// The [`Job`] this stored form holds, moving the payload out.
    pub(crate) fn into_job(self, id: u64) -> Job {
        let rare = self.rare.map_or_else(Rare::default, |rare| *rare);
        let settings = rare.settings.map_or_else(Settings::default, |settings| *settings);
        Job {
            id,
            queue: self.queue.as_ref().to_owned(),
            payload: self.payload.into_vec(),
            priority: self.priority,
            not_before_ms: self.not_before_ms,
            max_attempts: settings.max_attempts,
            backoff: settings.backoff,
            lease_ttl_ms: settings.lease_ttl_ms,
            idempotency_key: settings.idempotency_key.map(String::from),
            tags: settings.tags,
            attempts: self.attempts,
            last_error: rare.last_error.map(String::from),
            state: self.state,
            lease: rare.lease,
            enqueued_at_ms: self.enqueued_at_ms,
            finished_at_ms: rare.finished_at_ms,
            result: rare.result.map(Vec::from),
        }
    }

    /// The [`Job`] this stored form holds, copied.
    pub(crate) fn to_job(&self, id: u64) -> Job {
        self.clone().into_job(id)
    }

    /// A borrowed view that serializes exactly as the [`Job`] would.
    pub(crate) fn as_written(&self, id: u64) -> JobRef<'_> {
        let rare = self.rare();
        let settings = self.settings();
        JobRef {
            id,
            queue: &self.queue,
            payload: &self.payload,
            priority: self.priority,
            not_before_ms: self.not_before_ms,
            max_attempts: settings.max_attempts,
            backoff: settings.backoff,
            lease_ttl_ms: settings.lease_ttl_ms,
            idempotency_key: settings.idempotency_key.as_deref(),
            tags: &settings.tags,
            attempts: self.attempts,
            last_error: rare.last_error.as_deref(),
            state: self.state,
            lease: rare.lease.as_ref(),
            enqueued_at_ms: self.enqueued_at_ms,
            finished_at_ms: rare.finished_at_ms,
            result: rare.result.as_deref(),
        }
    }

    #[cfg(test)]
    pub(crate) fn is_plain(&self) -> bool {
        self.rare.is_none()
    }

    fn rare(&self) -> &Rare {
        self.rare.as_deref().unwrap_or(&COMMON)
    }

    fn settings(&self) -> &Settings {
        self.rare().settings.as_deref().unwrap_or(&COMMON_SETTINGS)
    }

    /// The current (or, on a tombstone, the last) lease.
    pub(crate) fn lease(&self) -> Option<&Lease> {
        self.rare().lease.as_ref()
    }

    /// Dedup key within the queue.
    pub(crate) fn idempotency_key(&self) -> Option<&str> {
        self.settings().idempotency_key.as_deref()
    }

    /// Tags (sorted, deduplicated).
    pub(crate) fn tags(&self) -> &[String] {
        &self.settings().tags
    }

    /// Error text of the last failed attempt.
    pub(crate) fn last_error(&self) -> Option<&str> {
        self.rare().last_error.as_deref()
    }

    /// Cluster time the job became acked or dead.
    pub(crate) fn finished_at_ms(&self) -> Option<u64> {
        self.rare().finished_at_ms
    }
}

/// A tombstone as the tombstone table keeps it: every field of the job
/// but its id (the table's key) and its state (acked), the queue and the
/// lease holder as numbers the table names (most tombstones share a few
/// of each), in postcard's
/// encoding (LEB128 varints), each time as a difference from the one it
/// usually follows (the enqueue and the grant from the finish, the due
/// time from the enqueue, the lease's end from its grant plus the job's
/// lease length), so most take a byte or three; texts and bytes borrowed
/// when read. The finish time comes first and the queue second, so a purge and
/// a queue lookup read only the front. Only memory: snapshots and
/// everything else still see the [`Job`].
#[derive(Serialize, Deserialize)]
struct TombRecord<'a> {
    finished_at_ms: Option<u64>,
    queue: u32,
    #[serde(borrow)]
    payload: Bytes<'a>,
    priority: i32,
    not_before_ms: i64,
    enqueued_at_ms: i64,
    attempts: u32,
    #[serde(borrow)]
    settings: Option<SettingsRecord<'a>>,
    last_error: Option<&'a str>,
    lease: Option<LeaseRecord>,
    #[serde(borrow)]
    result: Option<Bytes<'a>>,
}

/// The settings of a [`TombRecord`], when not the common ones.
#[derive(Serialize, Deserialize)]
struct SettingsRecord<'a> {
    max_attempts: u32,
    backoff_base_ms: u64,
    backoff_cap_ms: u64,
    lease_ttl_ms: u64,
    idempotency_key: Option<&'a str>,
    #[serde(borrow)]
    tags: Vec<&'a str>,
}

/// The lease of a [`TombRecord`]: its job id as a difference from the
/// job's own, its times from the finish time.
#[derive(Serialize, Deserialize)]
struct LeaseRecord {
    job_id: i64,
    holder: u32,
    token: u64,
    epoch: u64,
    granted_at_ms: i64,
    expires_at_ms: i64,
}

/// Bytes written as one length and the bytes (not a sequence of numbers),
/// read back borrowed.
struct Bytes<'a>(&'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Bytes<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <&'de [u8]>::deserialize(deserializer).map(Bytes)
    }
}

/// `time` as a difference from `base` (wrapping: any two times round-trip).
fn delta(time: u64, base: u64) -> i64 {
    time.wrapping_sub(base) as i64
}

/// The time `delta` away from `base` (the inverse of [`delta`]).
fn undelta(delta: i64, base: u64) -> u64 {
    base.wrapping_add(delta as u64)
}

/// What a tombstone record starts with: its finish time and queue.
type RecordFront = (Option<u64>, u32);

/// The finish time of a tombstone record ([`StoredJob::to_record`]).
pub(crate) fn tomb_finished_at(record: &[u8]) -> Option<u64> {
    postcard::take_from_bytes::<Option<u64>>(record).ok().and_then(|(finished, _)| finished)
}

/// The number of a tombstone record's queue ([`StoredJob::to_record`]).
pub(crate) fn tomb_queue(record: &[u8]) -> Option<u32> {
    postcard::take_from_bytes::<RecordFront>(record).ok().map(|((_, queue), _)| queue)
}

/// The names a tombstone record refers to by number: its queue, and its
/// lease's holder if it has a lease.
pub(crate) fn tomb_names(record: &[u8]) -> (u32, Option<u32>) {
    match postcard::from_bytes::<TombRecord<'_>>(record) {
        Ok(record) => (record.queue, record.lease.map(|lease| lease.holder)),
        Err(_) => (u32::MAX, None),
    }
}

impl StoredJob {
    /// This job as a tombstone record (see [`TombRecord`]); `id` is the
    /// job's, which the record leaves out, and `name` numbers its queue
    /// and its lease's holder.
    pub(crate) fn to_record(&self, id: u64, mut name: impl FnMut(&str) -> u32) -> Box<[u8]> {
        let rare = self.rare();
        let base = rare.finished_at_ms.unwrap_or(0);
        let record = TombRecord {
            finished_at_ms: rare.finished_at_ms,
            queue: name(&self.queue),
            payload: Bytes(&self.payload),
            priority: self.priority,
            not_before_ms: delta(self.not_before_ms, self.enqueued_at_ms),
            enqueued_at_ms: delta(self.enqueued_at_ms, base),
            attempts: self.attempts,
            settings: rare.settings.as_deref().map(|settings| SettingsRecord {
                max_attempts: settings.max_attempts,
                backoff_base_ms: settings.backoff.base_ms,
                backoff_cap_ms: settings.backoff.cap_ms,
                lease_ttl_ms: settings.lease_ttl_ms,
                idempotency_key: settings.idempotency_key.as_deref(),
                tags: settings.tags.iter().map(String::as_str).collect(),
            }),
            last_error: rare.last_error.as_deref(),
            lease: rare.lease.as_ref().map(|lease| LeaseRecord {
                job_id: delta(lease.job_id, id),
                holder: name(&lease.holder),
                token: lease.token,
                epoch: lease.epoch,
                granted_at_ms: delta(lease.granted_at_ms, base),
                expires_at_ms: delta(
                    lease.expires_at_ms,
                    lease.granted_at_ms.wrapping_add(self.settings().lease_ttl_ms),
                ),
            }),
            result: rare.result.as_deref().map(Bytes),
        };
        // Every field has a known length: writing to memory cannot fail.
        postcard::to_allocvec(&record)
            .map(Vec::into_boxed_slice)
            .expect("a tombstone record encodes (every length is known)")
    }

    /// The acked job `id` a tombstone record holds, `name` giving the
    /// names its numbers stand for. Records are only ever this build's own
    /// ([`StoredJob::to_record`]), so one that does not decode is a bug,
    /// not input.
    pub(crate) fn from_record<'n>(
        id: u64,
        record: &[u8],
        name: impl Fn(u32) -> &'n str,
    ) -> StoredJob {
        let record: TombRecord<'_> =
            postcard::from_bytes(record).expect("a tombstone record is this build's own encoding");
        let base = record.finished_at_ms.unwrap_or(0);
        let settings = record.settings.map(|settings| {
            Box::new(Settings {
                max_attempts: settings.max_attempts,
                backoff: Backoff {
                    base_ms: settings.backoff_base_ms,
                    cap_ms: settings.backoff_cap_ms,
                },
                lease_ttl_ms: settings.lease_ttl_ms,
                idempotency_key: settings.idempotency_key.map(Box::from),
                tags: settings.tags.into_iter().map(String::from).collect(),
            })
        });
        let lease_ttl_ms =
            settings.as_deref().map_or(COMMON_LEASE_TTL_MS, |settings| settings.lease_ttl_ms);
        let rare = Rare {
            settings,
            last_error: record.last_error.map(Box::from),
            lease: record.lease.map(|lease| {
                let granted_at_ms = undelta(lease.granted_at_ms, base);
                Lease {
                    job_id: undelta(lease.job_id, id),
                    holder: name(lease.holder).to_owned(),
                    token: lease.token,
                    epoch: lease.epoch,
                    granted_at_ms,
                    expires_at_ms: undelta(
                        lease.expires_at_ms,
                        granted_at_ms.wrapping_add(lease_ttl_ms),
                    ),
                }
            }),
            finished_at_ms: record.finished_at_ms,
            result: record.result.map(|result| Box::from(result.0)),
        };
        let enqueued_at_ms = undelta(record.enqueued_at_ms, base);
        StoredJob {
            queue: Arc::from(name(record.queue)),
            payload: Box::from(record.payload.0),
            not_before_ms: undelta(record.not_before_ms, enqueued_at_ms),
            enqueued_at_ms,
            priority: record.priority,
            attempts: record.attempts,
            state: JobState::Acked,
            rare: (rare != *COMMON).then(|| Box::new(rare)),
        }
    }
}

/// A [`Job`] borrowed from its [`StoredJob`]: the same fields in the same
/// order, so it serializes to the same bytes.
#[derive(Serialize)]
pub(crate) struct JobRef<'a> {
    id: u64,
    queue: &'a str,
    payload: &'a [u8],
    priority: i32,
    not_before_ms: u64,
    max_attempts: u32,
    backoff: Backoff,
    lease_ttl_ms: u64,
    idempotency_key: Option<&'a str>,
    tags: &'a [String],
    attempts: u32,
    last_error: Option<&'a str>,
    state: JobState,
    lease: Option<&'a Lease>,
    enqueued_at_ms: u64,
    finished_at_ms: Option<u64>,
    result: Option<&'a [u8]>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            id: 7,
            queue: "q".into(),
            payload: b"payload".to_vec(),
            priority: 2,
            not_before_ms: 10,
            max_attempts: COMMON_MAX_ATTEMPTS,
            backoff: Backoff::default(),
            lease_ttl_ms: COMMON_LEASE_TTL_MS,
            idempotency_key: None,
            tags: Vec::new(),
            attempts: 1,
            last_error: None,
            state: JobState::Ready,
            lease: None,
            enqueued_at_ms: 5,
            finished_at_ms: None,
            result: None,
        }
    }

    #[test]
    fn a_stored_job_is_small() {
        // Queue name, payload, two times, priority, attempts, state and
        // the side part's pointer: what a ready job costs before indexes.
        assert!(std::mem::size_of::<StoredJob>() <= 72, "{}", std::mem::size_of::<StoredJob>());
        assert_eq!(std::mem::size_of::<Option<StoredJob>>(), std::mem::size_of::<StoredJob>());
        // A tombstone of a job with default settings: its lease and finish
        // time in a side part of at most 120 bytes (a 128-byte block).
        assert!(std::mem::size_of::<Rare>() <= 120, "{}", std::mem::size_of::<Rare>());
    }

    #[test]
    fn every_field_survives_the_compact_form_and_serializes_as_the_job() {
        let lease = Lease {
            job_id: 7,
            holder: "w".into(),
            token: 3,
            epoch: 1,
            granted_at_ms: 11,
            expires_at_ms: 12,
        };
        let variants = [
            job(),
            Job { max_attempts: 9, ..job() },
            Job { backoff: Backoff { base_ms: 1, cap_ms: 2 }, ..job() },
            Job { lease_ttl_ms: 1_000, ..job() },
            Job { idempotency_key: Some("k".into()), ..job() },
            Job { tags: vec!["a".into(), "b".into()], ..job() },
            Job { last_error: Some("e".into()), ..job() },
            Job {
                state: JobState::Acked,
                lease: Some(lease.clone()),
                finished_at_ms: Some(13),
                ..job()
            },
            Job {
                idempotency_key: Some("k".into()),
                state: JobState::Acked,
                lease: Some(lease),
                finished_at_ms: Some(13),
                result: Some(Vec::new()),
                ..job()
            },
            Job { result: Some(b"r".to_vec()), ..job() },
        ];
        for (i, job) in variants.into_iter().enumerate() {
            let stored = StoredJob::from_job(job.clone(), Arc::from("q"));
            assert_eq!(stored.is_plain(), i == 0, "variant {i}: side part only when needed");
            assert_eq!(stored.to_job(7), job, "variant {i}");
            assert_eq!(
                bincode::serialize(&stored.as_written(7)).expect("serializes"),
                bincode::serialize(&job).expect("serializes"),
                "variant {i}"
            );
            assert_eq!(stored.clone().into_job(7), job, "variant {i}");
        }
    }
}
