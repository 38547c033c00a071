//! Peer adverts: the heartbeat every node sends every peer, and the peer
//! registry that keeps the last valid advert of each node.
//!
//! An advert is signed with the cluster secret
//! ([`leasehold_security::secret`]). The registry accepts it only when it
//! is authentic (the MAC verifies, or the connection's node certificate
//! vouches for it), the body decodes, it comes from the node that sent it
//! and not from this one, and it is newer (by the sender's `sent_at_ms`)
//! than the one held; anything else is dropped and counted, by reason.
//!
//! The sender's clock orders its own adverts: one is taken only if its
//! `sent_at_ms` is later than the held one's, whatever this node's clock
//! says, so an earlier advert replayed never passes for the newest (a
//! rolled-back build's last advert saying `journal_lease`, say), however
//! far ahead the sender's clock runs. A sender whose clock stepped back is
//! unheard until its clock passes its last advert, or until that advert
//! is stale (older here than the stale age): then an advert sent within
//! the stale age of this node's clock, and not from its future (at most
//! [`FUTURE_SLACK_MS`] ahead), is taken, so an advert from the far future
//! (a clock stepped ahead and back, or a forger) silences its node for no
//! longer than the stale age, and an advert captured long ago cannot make
//! a node that went away look current. Ages are measured on this node's
//! monotonic clock from the moment an advert was accepted, so a peer's
//! clock never makes its advert look younger than it is.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use leasehold_proto::v1;
use leasehold_storage::local::KeptAdvert;
use prost::Message;

use leasehold_security::secret::{ADVERT_DOMAIN, ClusterSecret};

use crate::stores::AdvertStore;

/// Why an advert was dropped (the `reason` label of the rejection metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// No MAC, or one that does not verify with the cluster secret.
    BadMac,
    /// The body is not an `Advert`, or a field of it is not valid: the
    /// field (as `body.node_id`) and what is wrong with it.
    Malformed {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A text field longer than [`MAX_TEXT_BYTES`] (counted as malformed).
    TooLong {
        /// The field.
        field: &'static str,
    },
    /// The advert claims to come from this node.
    FromSelf,
    /// Not newer than the advert held for that node (a replay).
    Replay,
    /// The advert speaks for another node than the one that sent it.
    NotSender,
}

/// The stale age a registry assumes until told the gate's.
pub const DEFAULT_STALE_AFTER_MS: u64 = 30_000;

/// Longest `version` or `role` an advert may carry (bytes): the registry
/// keeps them, on disk too, and status shows them.
pub const MAX_TEXT_BYTES: usize = 256;

/// How far ahead of this node's clock an advert's `sent_at_ms` may be to
/// replace a stale one sent later (see the module doc).
pub const FUTURE_SLACK_MS: u64 = 2_000;

/// Who delivered an advert, as the call's authentication established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sender {
    /// The node the connection's certificate or node proof names.
    pub node: u64,
    /// The node was named by its certificate (TLS): the connection vouches
    /// for the body, and the MAC is not needed.
    pub by_certificate: bool,
}

impl Rejection {
    /// Lower-case label for metrics and events.
    pub fn label(self) -> &'static str {
        match self {
            Rejection::BadMac => "bad_mac",
            Rejection::Malformed { .. } | Rejection::TooLong { .. } => "malformed",
            Rejection::FromSelf => "from_self",
            Rejection::Replay => "replay",
            Rejection::NotSender => "not_sender",
        }
    }
}

/// The last valid advert of one peer, and when it was accepted.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The advert as it was sent.
    pub advert: v1::Advert,
    /// When this node accepted it (monotonic).
    pub received: Instant,
    /// Its `sent_at_ms`: what a newer advert must beat (while it is not
    /// stale).
    pub order_ms: u64,
}

impl Entry {
    /// The advert's age at `now`, in ms.
    pub fn age_ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.received).as_millis()).unwrap_or(u64::MAX)
    }
}

/// The last valid advert per peer, by node id. With a store, every accepted
/// advert is also kept on disk and read back at start: a restarted node
/// must judge a member that is down by that member's last advert, as the
/// nodes that stayed up do, or its empty registry ("never heard from")
/// would send it alone to the bus and split the pool.
#[derive(Debug)]
pub struct PeerRegistry {
    node_id: u64,
    /// Past this age a held advert may be replaced by one sent earlier.
    stale_after_ms: u64,
    entries: Mutex<BTreeMap<u64, Entry>>,
    store: Option<Arc<dyn AdvertStore>>,
}

/// Signs `advert` with `secret`.
pub fn seal(secret: &ClusterSecret, advert: &v1::Advert) -> v1::Signed {
    let body = advert.encode_to_vec();
    let mac = secret.sign(ADVERT_DOMAIN, &body);
    v1::Signed { body, mac }
}

impl PeerRegistry {
    /// An empty registry on node `node_id`.
    pub fn new(node_id: u64) -> PeerRegistry {
        PeerRegistry {
            node_id,
            stale_after_ms: DEFAULT_STALE_AFTER_MS,
            entries: Mutex::new(BTreeMap::new()),
            store: None,
        }
    }

    /// A registry on node `node_id` kept in `store`, starting with the
    /// adverts kept there. `now_ms` (this node's wall clock) against the
    /// wall time each advert arrived gives its age; an advert whose age
    /// cannot be placed on the monotonic clock is left out (never heard
    /// from, as a stale one would count anyway).
    pub fn with_store(
        node_id: u64,
        store: Arc<dyn AdvertStore>,
        now: Instant,
        now_ms: u64,
    ) -> PeerRegistry {
        let mut entries = BTreeMap::new();
        match store.kept() {
            Ok((kept, skipped)) => {
                if skipped > 0 {
                    tracing::info!(skipped, "kept peer adverts that do not decode were left out");
                }
                for kept in kept {
                    let Some(entry) = entry_of(&kept, now, now_ms) else { continue };
                    if entry.advert.node_id != node_id {
                        entries.insert(entry.advert.node_id, entry);
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "could not read the kept peer adverts"),
        }
        PeerRegistry {
            node_id,
            stale_after_ms: DEFAULT_STALE_AFTER_MS,
            entries: Mutex::new(entries),
            store: Some(store),
        }
    }

    /// The same registry, taking a held advert for stale past
    /// `stale_after_ms` (the gate's stale age).
    pub fn stale_after(mut self, stale_after_ms: u64) -> PeerRegistry {
        self.stale_after_ms = stale_after_ms;
        self
    }

    /// Checks and, when valid, keeps a signed advert delivered by `sender`
    /// at `now` (`now_ms` on this node's wall clock, for the store and the
    /// window a stale advert's replacement must fall in). Answers the
    /// accepted advert's node id, or why it was dropped.
    pub fn accept(
        &self,
        secret: &ClusterSecret,
        signed: &v1::Signed,
        sender: Sender,
        now: Instant,
        now_ms: u64,
    ) -> Result<u64, Rejection> {
        if !sender.by_certificate && !secret.verify(ADVERT_DOMAIN, &signed.body, &signed.mac) {
            return Err(Rejection::BadMac);
        }
        let advert = v1::Advert::decode(signed.body.as_slice()).map_err(|_| {
            Rejection::Malformed { field: "body", problem: "not an encoded leasehold.v1.Advert" }
        })?;
        check_advert(&advert)?;
        if advert.node_id == self.node_id {
            return Err(Rejection::FromSelf);
        }
        if advert.node_id != sender.node {
            return Err(Rejection::NotSender);
        }
        let order_ms = advert.sent_at_ms;
        let mut entries = self.lock()?;
        if let Some(held) = entries.get(&advert.node_id)
            && held.order_ms >= order_ms
        {
            // Sent earlier than the held one: a replay, unless the held one
            // is stale and this one was sent within the stale age of this
            // node's clock, and not from its future (its sender's clock
            // stepped back). An advert captured earlier cannot pass: it
            // would keep a node that went away looking current.
            let recent = order_ms >= now_ms.saturating_sub(self.stale_after_ms)
                && order_ms <= now_ms.saturating_add(FUTURE_SLACK_MS);
            if held.age_ms(now) < self.stale_after_ms || !recent {
                return Err(Rejection::Replay);
            }
        }
        let node = advert.node_id;
        entries.insert(node, Entry { advert, received: now, order_ms });
        if let Some(store) = &self.store {
            let kept = KeptAdvert { node, received_ms: now_ms, body: signed.body.clone() };
            // Best effort: a lost write only makes a restart forget this
            // peer until its next advert.
            if let Err(error) = store.keep(&kept) {
                tracing::warn!(%error, node, "could not keep a peer advert on disk");
            }
        }
        Ok(node)
    }

    /// A copy of every entry, or `None` when the registry cannot be read
    /// (a poisoned lock: a bug elsewhere; the gate then stays on the bus).
    pub fn snapshot(&self) -> Option<BTreeMap<u64, Entry>> {
        self.entries.lock().ok().map(|entries| entries.clone())
    }

    /// Forgets entries older than `max_age_ms` whose node is not in
    /// `members` (a removed node that went quiet).
    pub fn prune(&self, members: &[u64], max_age_ms: u64, now: Instant) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|node, entry| members.contains(node) || entry.age_ms(now) < max_age_ms);
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<u64, Entry>>, Rejection> {
        // A poisoned registry cannot take adverts; count them as malformed
        // rather than panicking on the network path.
        self.entries.lock().map_err(|_| Rejection::Malformed {
            field: "body",
            problem: "the registry is unusable",
        })
    }
}

/// Checks the fields of a decoded advert the registry keeps: it names a
/// node, and its texts are bounded.
pub fn check_advert(advert: &v1::Advert) -> Result<(), Rejection> {
    if advert.node_id == 0 {
        return Err(Rejection::Malformed { field: "body.node_id", problem: "must be at least 1" });
    }
    if advert.version.len() > MAX_TEXT_BYTES {
        return Err(Rejection::TooLong { field: "body.version" });
    }
    if advert.role.len() > MAX_TEXT_BYTES {
        return Err(Rejection::TooLong { field: "body.role" });
    }
    Ok(())
}

/// One kept advert back from the store, aged by wall time.
fn entry_of(kept: &KeptAdvert, now: Instant, now_ms: u64) -> Option<Entry> {
    let advert = v1::Advert::decode(kept.body.as_slice()).ok()?;
    if advert.node_id != kept.node {
        return None;
    }
    let age = Duration::from_millis(now_ms.saturating_sub(kept.received_ms));
    let received = now.checked_sub(age)?;
    let order_ms = advert.sent_at_ms;
    Some(Entry { advert, received, order_ms })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn peer(node: u64) -> Sender {
        Sender { node, by_certificate: false }
    }

    fn secret(text: &str) -> ClusterSecret {
        ClusterSecret::from_text(text).expect("test secrets are long enough")
    }

    fn advert(node_id: u64, sent_at_ms: u64, journal_lease: Option<bool>) -> v1::Advert {
        v1::Advert {
            node_id,
            version: "test".into(),
            journal_lease,
            sent_at_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_valid_advert_is_kept_and_ages() {
        let key = secret("the cluster secret of the test");
        let registry = PeerRegistry::new(1);
        let t0 = Instant::now();
        assert_eq!(
            registry.accept(&key, &seal(&key, &advert(2, 10, Some(true))), peer(2), t0, 0),
            Ok(2)
        );
        let entries = registry.snapshot().expect("readable");
        assert_eq!(entries[&2].advert.journal_lease, Some(true));
        assert_eq!(entries[&2].age_ms(t0 + Duration::from_millis(1_500)), 1_500);
    }

    #[test]
    fn forged_self_and_replayed_adverts_change_nothing() {
        let key = secret("the cluster secret of the test");
        let forger = secret("a different secret, not ours");
        let registry = PeerRegistry::new(1);
        let now = Instant::now();
        assert_eq!(
            registry.accept(&key, &seal(&key, &advert(2, 10, Some(true))), peer(2), now, 0),
            Ok(2)
        );

        let forged = seal(&forger, &advert(2, 20, Some(false)));
        assert_eq!(registry.accept(&key, &forged, peer(2), now, 0), Err(Rejection::BadMac));
        let mut tampered = seal(&key, &advert(2, 30, Some(true)));
        tampered.body = advert(2, 30, Some(false)).encode_to_vec();
        assert_eq!(registry.accept(&key, &tampered, peer(2), now, 0), Err(Rejection::BadMac));
        let unsigned = v1::Signed { body: advert(2, 40, Some(false)).encode_to_vec(), mac: vec![] };
        assert_eq!(registry.accept(&key, &unsigned, peer(2), now, 0), Err(Rejection::BadMac));
        let garbage = v1::Signed { body: vec![0xff; 8], mac: key.sign(ADVERT_DOMAIN, &[0xff; 8]) };
        assert!(matches!(
            registry.accept(&key, &garbage, peer(2), now, 0),
            Err(Rejection::Malformed { field: "body", .. })
        ));
        let nobody = advert(0, 60, Some(false));
        assert!(matches!(
            registry.accept(&key, &seal(&key, &nobody), peer(2), now, 0),
            Err(Rejection::Malformed { field: "body.node_id", .. })
        ));
        let long = "x".repeat(MAX_TEXT_BYTES + 1);
        let chatty = v1::Advert { version: long.clone(), ..advert(2, 70, Some(false)) };
        assert_eq!(
            registry.accept(&key, &seal(&key, &chatty), peer(2), now, 0),
            Err(Rejection::TooLong { field: "body.version" })
        );
        let chatty = v1::Advert { role: long, ..advert(2, 80, Some(false)) };
        assert_eq!(
            registry.accept(&key, &seal(&key, &chatty), peer(2), now, 0),
            Err(Rejection::TooLong { field: "body.role" })
        );
        let edge = "x".repeat(MAX_TEXT_BYTES);
        let at_the_limit =
            v1::Advert { version: edge.clone(), role: edge, ..advert(2, 90, Some(true)) };
        assert_eq!(check_advert(&at_the_limit), Ok(()));
        assert_eq!(
            registry.accept(&key, &seal(&key, &advert(1, 50, Some(false))), peer(1), now, 0),
            Err(Rejection::FromSelf)
        );
        assert_eq!(
            registry.accept(&key, &seal(&key, &advert(2, 10, Some(false))), peer(2), now, 0),
            Err(Rejection::Replay)
        );

        let entries = registry.snapshot().expect("readable");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[&2].advert, advert(2, 10, Some(true)));
    }

    #[test]
    fn an_advert_must_come_from_its_sender_and_a_certificate_stands_for_the_mac() {
        let key = secret("the cluster secret of the test");
        let registry = PeerRegistry::new(1);
        let now = Instant::now();
        let from_two = seal(&key, &advert(2, 10, Some(true)));
        assert_eq!(registry.accept(&key, &from_two, peer(3), now, 0), Err(Rejection::NotSender));
        let unsigned = v1::Signed { body: advert(2, 20, Some(true)).encode_to_vec(), mac: vec![] };
        let by_certificate = Sender { node: 2, by_certificate: true };
        assert_eq!(registry.accept(&key, &unsigned, by_certificate, now, 0), Ok(2));
        let certified_three = Sender { node: 3, by_certificate: true };
        let unsigned_two = v1::Signed { body: advert(2, 30, None).encode_to_vec(), mac: vec![] };
        assert_eq!(
            registry.accept(&key, &unsigned_two, certified_three, now, 0),
            Err(Rejection::NotSender),
            "a certificate vouches only for its own node"
        );
    }

    #[test]
    fn an_advert_from_the_far_future_silences_its_node_only_until_stale() {
        let key = secret("the cluster secret of the test");
        let registry = PeerRegistry::new(1).stale_after(30_000);
        let now = Instant::now();
        let now_ms = 1_000_000;
        // A year ahead: taken, as its sender's newest.
        let future = seal(&key, &advert(2, now_ms + 31_536_000_000, Some(false)));
        assert_eq!(registry.accept(&key, &future, peer(2), now, now_ms), Ok(2));
        let honest = |sent| seal(&key, &advert(2, sent, Some(true)));
        // The node's honest adverts are replays until that one is stale.
        let soon = now + Duration::from_secs(29);
        assert_eq!(
            registry.accept(&key, &honest(now_ms + 29_000), peer(2), soon, now_ms + 29_000),
            Err(Rejection::Replay)
        );
        let stale = now + Duration::from_secs(30);
        // Then one from the future still cannot replace it, an honest one can.
        let ahead = seal(&key, &advert(2, now_ms + 40_000, Some(false)));
        assert_eq!(
            registry.accept(&key, &ahead, peer(2), stale, now_ms + 30_000),
            Err(Rejection::Replay)
        );
        // Nor one captured long ago (it would make a node gone away look
        // current), only one sent within the stale age.
        assert_eq!(
            registry.accept(&key, &honest(now_ms - 1), peer(2), stale, now_ms + 30_000),
            Err(Rejection::Replay)
        );
        assert_eq!(
            registry.accept(&key, &honest(now_ms + 30_000), peer(2), stale, now_ms + 30_000),
            Ok(2)
        );
        let entries = registry.snapshot().expect("readable");
        assert_eq!(entries[&2].advert.journal_lease, Some(true));
    }

    #[test]
    fn a_clock_ahead_cannot_make_an_earlier_advert_pass_for_the_newest() {
        // Node 2 runs 10 s ahead. Its advert A1 says journal_lease; then it
        // is rolled back to a build whose advert A2 has no such field. A1
        // replayed after A2 must not be taken for the newest.
        let key = secret("the cluster secret of the test");
        let registry = PeerRegistry::new(1);
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let ahead = 10_000;
        let first = seal(&key, &advert(2, 100_000 + ahead, Some(true)));
        let second = seal(&key, &advert(2, 103_000 + ahead, None));
        assert_eq!(registry.accept(&key, &first, peer(2), at(0), 100_000), Ok(2));
        assert_eq!(registry.accept(&key, &second, peer(2), at(3), 103_000), Ok(2));
        assert_eq!(
            registry.accept(&key, &first, peer(2), at(4), 104_000),
            Err(Rejection::Replay),
            "the earlier advert replayed"
        );
        let entries = registry.snapshot().expect("readable");
        assert_eq!(entries[&2].advert.journal_lease, None);
    }

    #[test]
    fn an_older_peer_advert_without_the_field_reads_as_none() {
        let key = secret("the cluster secret of the test");
        let registry = PeerRegistry::new(1);
        let now = Instant::now();
        assert_eq!(registry.accept(&key, &seal(&key, &advert(3, 1, None)), peer(3), now, 0), Ok(3));
        assert_eq!(registry.snapshot().expect("readable")[&3].advert.journal_lease, None);
    }

    #[test]
    fn a_restarted_registry_reads_kept_adverts_back_with_their_age() {
        let key = secret("the cluster secret of the test");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let (log, _) = leasehold_storage::open(dir.path()).expect("a temporary store");
        let tree = log.peer_store().expect("the peer store");
        let t0 = Instant::now();
        let tree: Arc<dyn AdvertStore> = Arc::new(tree);
        let registry = PeerRegistry::with_store(1, tree.clone(), t0, 100_000);
        assert_eq!(
            registry.accept(&key, &seal(&key, &advert(2, 10, Some(true))), peer(2), t0, 100_000),
            Ok(2)
        );
        assert_eq!(
            registry.accept(&key, &seal(&key, &advert(3, 10, None)), peer(3), t0, 101_000),
            Ok(3)
        );
        drop(registry);

        // "Restarted" 4 s later by the wall clock.
        let later = Instant::now();
        let restarted = PeerRegistry::with_store(1, tree, later, 104_000);
        let entries = restarted.snapshot().expect("readable");
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[&2].advert.journal_lease, Some(true));
        assert_eq!(entries[&3].advert.journal_lease, None);
        assert_eq!(entries[&2].age_ms(later), 4_000);
        assert_eq!(entries[&3].age_ms(later), 3_000);
        // A replay of the kept advert is still refused after the restart.
        assert_eq!(
            restarted.accept(
                &key,
                &seal(&key, &advert(2, 10, Some(false))),
                peer(2),
                later,
                104_000
            ),
            Err(Rejection::Replay)
        );
    }

    #[test]
    fn prune_keeps_members_and_recent_strangers() {
        let key = secret("the cluster secret of the test");
        let registry = PeerRegistry::new(1);
        let t0 = Instant::now();
        for node in [2, 3] {
            registry
                .accept(&key, &seal(&key, &advert(node, 1, Some(true))), peer(node), t0, 0)
                .expect("valid");
        }
        registry.prune(&[1, 2], 10_000, t0 + Duration::from_secs(5));
        assert_eq!(registry.snapshot().expect("readable").len(), 2);
        registry.prune(&[1, 2], 10_000, t0 + Duration::from_secs(11));
        assert_eq!(registry.snapshot().expect("readable").keys().copied().collect::<Vec<_>>(), [2]);
    }
}
