//! The broadcast ("bus") claim path: best-effort claims for pools whose
//! peers cannot all take part in the journal lease.
//!
//! A claimant records `BusClaim{key, node, at}` in its own table and sends
//! it to every online peer; each peer records it and answers with every
//! claim it holds for the key (its own included). After a short collection
//! window the lowest `(at, node)` in the claimant's table wins
//! ([`BusRecord`], in core). The table is local and unreplicated
//! (a [`BusStore`]: the node's is `BusTable`, in storage). A winner that has run the work releases
//! the key by broadcast; a released key is kept as a tombstone (until
//! [`Bus::prune`]) so a late claimant cannot win it again.
//!
//! **The bus may run a job twice.** Two nodes that cannot reach each other
//! (a partition, a dropped message, a peer not yet heard from) each see only
//! their own claim and each win. That is why the bus is the fallback and the
//! journal lease the path the cutover gate moves to once every peer can.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::bus::BusRecord;
use leasehold_proto::v1;
use prost::Message;

use leasehold_security::secret::{BUS_DOMAIN, ClusterSecret};

use crate::adverts::Sender;
use crate::stores::{BusStore, StoreError};

/// Why a bus operation failed locally: the table failed, or holds a
/// record that does not decode (a damaged or foreign value).
#[derive(Debug, thiserror::Error)]
#[error("bus table: {0}")]
pub struct BusError(#[from] StoreError);

impl From<leasehold_storage::StorageError> for BusError {
    fn from(error: leasehold_storage::StorageError) -> BusError {
        BusError(StoreError::new(error))
    }
}

/// What the table holds for one key.
pub type Record = BusRecord;

/// The outcome of one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This node won: run the work, then release.
    Won,
    /// Another node won (or the key was already released).
    Lost {
        /// The winner, when known.
        winner: Option<u64>,
    },
}

/// The local bus table and this node's side of the protocol.
#[derive(Clone)]
pub struct Bus {
    node_id: u64,
    table: Arc<dyn BusStore>,
}

impl Bus {
    /// The bus of node `node_id` over `table`.
    pub fn new(node_id: u64, table: Arc<dyn BusStore>) -> Bus {
        Bus { node_id, table }
    }

    /// The record of `key`.
    pub fn record(&self, key: &str) -> Result<Record, BusError> {
        Ok(self.table.get(key)?)
    }

    fn update(
        &self,
        key: &str,
        now_ms: u64,
        change: impl Fn(&mut Record),
    ) -> Result<Record, BusError> {
        // Atomic per key: the service and the ticker may touch one at once.
        Ok(self.table.update(key, &|record| {
            change(record);
            record.touched_ms = now_ms;
        })?)
    }

    /// Records a claim (this node's or a peer's) and answers the key's record.
    pub fn record_claim(&self, claim: &v1::BusClaim, now_ms: u64) -> Result<Record, BusError> {
        self.update(&claim.key, now_ms, |record| record.add(claim.at_ms, claim.node))
    }

    /// Marks `key` released by `node` when `node` won it (a release from a
    /// node that did not win changes nothing).
    pub fn record_release(&self, key: &str, node: u64, now_ms: u64) -> Result<Record, BusError> {
        self.update(key, now_ms, |record| record.release_by(node))
    }

    /// Answers a peer's signed bus message, or why it was refused.
    pub fn serve(&self, message: v1::BusMessage, now_ms: u64) -> Result<v1::BusReply, BusError> {
        let (key, record) = match message.kind {
            Some(v1::bus_message::Kind::Claim(claim)) => {
                (claim.key.clone(), self.record_claim(&claim, now_ms)?)
            }
            Some(v1::bus_message::Kind::Release(release)) => {
                (release.key.clone(), self.record_release(&release.key, release.node, now_ms)?)
            }
            None => return Ok(v1::BusReply::default()),
        };
        Ok(reply(&key, &record))
    }

    /// Merges a peer's answer into the table.
    pub fn merge(&self, key: &str, answer: &v1::BusReply, now_ms: u64) -> Result<(), BusError> {
        self.update(key, now_ms, |record| {
            for claim in answer.claims.iter().filter(|c| c.key == key) {
                record.add(claim.at_ms, claim.node);
            }
            record.released |= answer.released;
        })?;
        Ok(())
    }

    /// Whether this node won `key`, judged from its table (call after the
    /// collection window).
    pub fn outcome(&self, key: &str) -> Result<Outcome, BusError> {
        let record = self.record(key)?;
        Ok(match record.winner() {
            Some(winner) if winner == self.node_id && !record.released => Outcome::Won,
            winner => Outcome::Lost { winner },
        })
    }

    /// Whether this node holds `key` (won it and not yet released).
    pub fn holds(&self, key: &str) -> Result<bool, BusError> {
        Ok(self.outcome(key)? == Outcome::Won)
    }

    /// The highest bucket of schedule `name` any node claimed on the bus
    /// (keys `cron:NAME:BUCKET`) that `counts`, read from the table.
    pub fn high_water(
        &self,
        name: &str,
        counts: impl Fn(u64) -> bool,
    ) -> Result<Option<u64>, BusError> {
        let prefix = format!("cron:{name}:");
        let mut high = None;
        for key in self.table.keys_with_prefix(&prefix)? {
            let bucket =
                key[prefix.len()..].split(':').next().and_then(|bucket| bucket.parse::<u64>().ok());
            high = high.max(bucket.filter(|bucket| counts(*bucket)));
        }
        Ok(high)
    }

    /// Drops records untouched since `before_ms` (and any that does not
    /// decode: it is only a local cache of claims long decided).
    pub fn prune(&self, before_ms: u64) -> Result<usize, BusError> {
        Ok(self.table.retain(&|record| record.touched_ms >= before_ms)?)
    }

    /// The records held, for tests and debugging.
    pub fn records(&self) -> Result<BTreeMap<String, Record>, BusError> {
        Ok(self.table.records()?.into_iter().collect())
    }
}

/// The reply describing `record`.
fn reply(key: &str, record: &Record) -> v1::BusReply {
    v1::BusReply {
        claims: record
            .claims
            .iter()
            .map(|(at_ms, node)| v1::BusClaim { key: key.to_string(), node: *node, at_ms: *at_ms })
            .collect(),
        released: record.released,
    }
}

/// Signs a bus message.
pub fn seal(secret: &ClusterSecret, message: &v1::BusMessage) -> v1::Signed {
    let body = message.encode_to_vec();
    let mac = secret.sign(BUS_DOMAIN, &body);
    v1::Signed { body, mac }
}

/// Longest key a bus message may name (bytes): keys are the idempotency
/// keys of schedule ticks (`cron:NAME:BUCKET[:NODE]`), which are bounded
/// as every idempotency key is.
pub const MAX_KEY_BYTES: usize = 256;

/// How far a bus message's time (`at_ms`) may be from this node's clock,
/// either way, before the message counts as a replay. Generous, since the
/// bus serves pools whose clocks may be off; it only has to keep a
/// captured message from being played back long after.
pub const REPLAY_WINDOW_MS: u64 = 10 * 60 * 1_000;

/// Why a peer's bus message was refused.
#[derive(Debug, thiserror::Error)]
pub enum BusRefusal {
    /// The MAC does not verify (and no node certificate vouches for it).
    #[error("mac: bus message is not signed with the cluster secret")]
    BadMac,
    /// Not a bus message.
    #[error("body: not an encoded leasehold.v1.BusMessage")]
    Malformed,
    /// A bus message that is neither a claim nor a release.
    #[error("body.kind: must be a claim or a release")]
    NoKind,
    /// A claim or release of the empty key.
    #[error("body.{kind}.key: must not be empty")]
    EmptyKey {
        /// `claim` or `release`.
        kind: &'static str,
    },
    /// A key longer than [`MAX_KEY_BYTES`].
    #[error("body.{kind}.key: is {bytes} bytes, limit {MAX_KEY_BYTES}")]
    KeyTooLong {
        /// `claim` or `release`.
        kind: &'static str,
        /// The key's length.
        bytes: usize,
    },
    /// It speaks for another node than the one that sent it.
    #[error("body.node: the message speaks for node {claimed}, but node {sender} sent it")]
    NotSender {
        /// The node named in the message.
        claimed: u64,
        /// The node that sent it.
        sender: u64,
    },
    /// Its time is outside [`REPLAY_WINDOW_MS`] of this node's clock.
    #[error("body.at_ms: {at_ms} is too far from this node's clock ({now_ms}); a replay")]
    Replay {
        /// The message's time.
        at_ms: u64,
        /// This node's clock.
        now_ms: u64,
    },
    /// The local table failed.
    #[error(transparent)]
    Store(BusError),
}

impl BusRefusal {
    /// Lower-case label for metrics and events.
    pub fn label(&self) -> &'static str {
        match self {
            BusRefusal::BadMac => "bad_mac",
            BusRefusal::Malformed
            | BusRefusal::NoKind
            | BusRefusal::EmptyKey { .. }
            | BusRefusal::KeyTooLong { .. } => "malformed",
            BusRefusal::NotSender { .. } => "not_sender",
            BusRefusal::Replay { .. } => "replay",
            BusRefusal::Store(_) => "store",
        }
    }
}

/// Checks and decodes a bus message delivered by `sender` at `now_ms`:
/// authentic (MAC, or the sender's certificate), speaking for its sender,
/// and timed within [`REPLAY_WINDOW_MS`] of this node's clock. A release
/// from a version that did not time releases (`at_ms` 0) is taken as it is.
pub fn open(
    secret: &ClusterSecret,
    signed: &v1::Signed,
    sender: Sender,
    now_ms: u64,
) -> Result<v1::BusMessage, BusRefusal> {
    if !sender.by_certificate && !secret.verify(BUS_DOMAIN, &signed.body, &signed.mac) {
        return Err(BusRefusal::BadMac);
    }
    let message =
        v1::BusMessage::decode(signed.body.as_slice()).map_err(|_| BusRefusal::Malformed)?;
    let (kind, key, node, at_ms) = match &message.kind {
        Some(v1::bus_message::Kind::Claim(claim)) => {
            ("claim", &claim.key, claim.node, Some(claim.at_ms))
        }
        Some(v1::bus_message::Kind::Release(release)) => {
            ("release", &release.key, release.node, (release.at_ms != 0).then_some(release.at_ms))
        }
        None => return Err(BusRefusal::NoKind),
    };
    if key.is_empty() {
        return Err(BusRefusal::EmptyKey { kind });
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(BusRefusal::KeyTooLong { kind, bytes: key.len() });
    }
    if node != sender.node {
        return Err(BusRefusal::NotSender { claimed: node, sender: sender.node });
    }
    if let Some(at_ms) = at_ms
        && at_ms.abs_diff(now_ms) > REPLAY_WINDOW_MS
    {
        return Err(BusRefusal::Replay { at_ms, now_ms });
    }
    Ok(message)
}

/// How long a claimant collects answers before it judges the claim.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(200);

#[cfg(test)]
mod tests {
    use super::*;

    fn bus(node: u64) -> Result<(tempfile::TempDir, Bus), BusError> {
        let dir = tempfile::tempdir().map_err(|source| {
            BusError::from(leasehold_storage::StorageError::CreateDir {
                path: Default::default(),
                source,
            })
        })?;
        let (log, _) = leasehold_storage::open(dir.path())?;
        Ok((dir, Bus::new(node, Arc::new(log.bus_table()?))))
    }

    fn claim(key: &str, node: u64, at_ms: u64) -> v1::BusClaim {
        v1::BusClaim { key: key.to_string(), node, at_ms }
    }

    #[test]
    fn the_lowest_at_then_node_wins_whatever_the_arrival_order() -> Result<(), BusError> {
        let (_a, one) = bus(1)?;
        let (_b, two) = bus(2)?;
        let key = "cron:backup:100";
        // Node 1 claims at 500, node 2 at 500 too: the tie goes to node 1.
        one.record_claim(&claim(key, 1, 500), 1)?;
        two.record_claim(&claim(key, 2, 500), 1)?;
        let answer = two.serve(
            v1::BusMessage { kind: Some(v1::bus_message::Kind::Claim(claim(key, 1, 500))) },
            2,
        )?;
        one.merge(key, &answer, 2)?;
        assert_eq!(one.outcome(key)?, Outcome::Won);
        assert_eq!(two.outcome(key)?, Outcome::Lost { winner: Some(1) });
        // An earlier claim beats a lower node id.
        one.record_claim(&claim("k2", 1, 600), 1)?;
        one.record_claim(&claim("k2", 3, 599), 1)?;
        assert_eq!(one.outcome("k2")?, Outcome::Lost { winner: Some(3) });
        Ok(())
    }

    #[test]
    fn a_released_key_cannot_be_won_again_and_only_the_winner_releases() -> Result<(), BusError> {
        let (_a, one) = bus(1)?;
        let key = "cron:backup:100";
        one.record_claim(&claim(key, 1, 500), 1)?;
        one.record_release(key, 2, 2)?;
        assert!(one.holds(key)?, "a release from a loser changes nothing");
        one.record_release(key, 1, 3)?;
        assert!(!one.holds(key)?);
        one.record_claim(&claim(key, 1, 900), 4)?;
        assert_eq!(one.outcome(key)?, Outcome::Lost { winner: Some(1) });
        // Releasing a key nobody holds is a no-op.
        let record = one.record_release("cron:other:1", 1, 5)?;
        assert!(!record.released && record.claims.is_empty());
        Ok(())
    }

    #[test]
    fn high_water_reads_cron_buckets_and_prune_drops_old_records() -> Result<(), BusError> {
        let (_a, one) = bus(1)?;
        for bucket in [1_700_000_005u64, 1_700_000_007, 1_700_000_006] {
            one.record_claim(&claim(&format!("cron:backup:{bucket}"), 2, 10), bucket)?;
        }
        one.record_claim(&claim("cron:backup2:1800000000", 2, 10), 1)?;
        assert_eq!(one.high_water("backup", |_| true)?, Some(1_700_000_007));
        assert_eq!(one.high_water("backup", |b| b < 1_700_000_007)?, Some(1_700_000_006));
        assert_eq!(one.high_water("none", |_| true)?, None);
        assert_eq!(one.prune(1_700_000_007)?, 3);
        assert_eq!(one.records()?.len(), 1);
        Ok(())
    }

    #[test]
    fn signed_messages_open_only_with_the_secret_from_their_sender_and_fresh()
    -> Result<(), leasehold_security::secret::SecretError> {
        let key = ClusterSecret::from_text("the cluster secret of the test")?;
        let other = ClusterSecret::from_text("not the cluster secret at all")?;
        let now_ms = 100 * REPLAY_WINDOW_MS;
        let node_one = Sender { node: 1, by_certificate: false };
        let message =
            v1::BusMessage { kind: Some(v1::bus_message::Kind::Claim(claim("k", 1, now_ms))) };
        let signed = seal(&key, &message);
        assert_eq!(open(&key, &signed, node_one, now_ms).ok(), Some(message.clone()));
        assert!(matches!(open(&other, &signed, node_one, now_ms), Err(BusRefusal::BadMac)));
        let node_two = Sender { node: 2, by_certificate: false };
        assert!(matches!(
            open(&key, &signed, node_two, now_ms),
            Err(BusRefusal::NotSender { claimed: 1, sender: 2 })
        ));
        let later = now_ms + REPLAY_WINDOW_MS + 1;
        assert!(matches!(open(&key, &signed, node_one, later), Err(BusRefusal::Replay { .. })));
        let unsigned = v1::Signed { body: signed.body.clone(), mac: Vec::new() };
        assert!(matches!(open(&key, &unsigned, node_one, now_ms), Err(BusRefusal::BadMac)));
        let certified = Sender { node: 1, by_certificate: true };
        assert_eq!(open(&key, &unsigned, certified, now_ms).ok(), Some(message));
        let legacy_release = v1::BusMessage {
            kind: Some(v1::bus_message::Kind::Release(v1::BusRelease {
                key: "k".into(),
                node: 1,
                at_ms: 0,
            })),
        };
        let signed = seal(&key, &legacy_release);
        assert!(open(&key, &signed, node_one, later).is_ok(), "an untimed release is taken");
        Ok(())
    }

    #[test]
    fn a_message_must_be_a_claim_or_a_release_of_a_bounded_key()
    -> Result<(), leasehold_security::secret::SecretError> {
        let key = ClusterSecret::from_text("the cluster secret of the test")?;
        let now_ms = 100 * REPLAY_WINDOW_MS;
        let node_one = Sender { node: 1, by_certificate: false };
        let claim_of = |name: &str| v1::BusMessage {
            kind: Some(v1::bus_message::Kind::Claim(claim(name, 1, now_ms))),
        };
        let release_of = |name: &str| v1::BusMessage {
            kind: Some(v1::bus_message::Kind::Release(v1::BusRelease {
                key: name.into(),
                node: 1,
                at_ms: now_ms,
            })),
        };
        let open_of = |message: &v1::BusMessage| open(&key, &seal(&key, message), node_one, now_ms);
        assert!(matches!(open_of(&v1::BusMessage { kind: None }), Err(BusRefusal::NoKind)));
        assert!(matches!(open_of(&claim_of("")), Err(BusRefusal::EmptyKey { kind: "claim" })));
        assert!(matches!(open_of(&release_of("")), Err(BusRefusal::EmptyKey { kind: "release" })));
        let long = "k".repeat(MAX_KEY_BYTES + 1);
        assert!(matches!(
            open_of(&claim_of(&long)),
            Err(BusRefusal::KeyTooLong { kind: "claim", bytes }) if bytes == MAX_KEY_BYTES + 1
        ));
        assert!(open_of(&claim_of(&"k".repeat(MAX_KEY_BYTES))).is_ok(), "a key at the limit");
        let garbage = v1::Signed { body: vec![0xff; 4], mac: key.sign(BUS_DOMAIN, &[0xff; 4]) };
        assert!(matches!(open(&key, &garbage, node_one, now_ms), Err(BusRefusal::Malformed)));
        Ok(())
    }
}
