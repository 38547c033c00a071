//! Peer adverts: the heartbeat every node sends every peer, and the peer
//! registry that keeps the last valid advert of each node.
//!
//! An advert is signed with the cluster secret ([`crate::secret`]). The
//! registry accepts it only when the MAC verifies, the body decodes, it does
//! not claim to come from this node, and it is newer (by the sender's
//! `sent_at_ms`) than the one held; anything else is dropped and counted,
//! by reason. Ages are measured on this node's monotonic clock from the
//! moment an advert was accepted, so a peer's clock never makes its advert
//! look younger than it is.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use leasehold_proto::v1;
use prost::Message;

use crate::secret::{ADVERT_DOMAIN, ClusterSecret};

/// Why an advert was dropped (the `reason` label of the rejection metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// No MAC, or one that does not verify with the cluster secret.
    BadMac,
    /// The body is not an `Advert`, or names node 0.
    Malformed,
    /// The advert claims to come from this node.
    FromSelf,
    /// Not newer than the advert held for that node (a replay).
    Replay,
}

impl Rejection {
    /// Lower-case label for metrics and events.
    pub fn label(self) -> &'static str {
        match self {
            Rejection::BadMac => "bad_mac",
            Rejection::Malformed => "malformed",
            Rejection::FromSelf => "from_self",
            Rejection::Replay => "replay",
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
}

impl Entry {
    /// The advert's age at `now`, in ms.
    pub fn age_ms(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.received).as_millis()).unwrap_or(u64::MAX)
    }
}

/// The last valid advert per peer, by node id.
#[derive(Debug)]
pub struct PeerRegistry {
    node_id: u64,
    entries: Mutex<BTreeMap<u64, Entry>>,
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
        PeerRegistry { node_id, entries: Mutex::new(BTreeMap::new()) }
    }

    /// Checks and, when valid, keeps a signed advert received at `now`.
    /// Answers the accepted advert's node id, or why it was dropped.
    pub fn accept(
        &self,
        secret: &ClusterSecret,
        signed: &v1::Signed,
        now: Instant,
    ) -> Result<u64, Rejection> {
        if !secret.verify(ADVERT_DOMAIN, &signed.body, &signed.mac) {
            return Err(Rejection::BadMac);
        }
        let advert =
            v1::Advert::decode(signed.body.as_slice()).map_err(|_| Rejection::Malformed)?;
        if advert.node_id == 0 {
            return Err(Rejection::Malformed);
        }
        if advert.node_id == self.node_id {
            return Err(Rejection::FromSelf);
        }
        let mut entries = self.lock()?;
        if let Some(held) = entries.get(&advert.node_id)
            && held.advert.sent_at_ms >= advert.sent_at_ms
        {
            return Err(Rejection::Replay);
        }
        let node = advert.node_id;
        entries.insert(node, Entry { advert, received: now });
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
        self.entries.lock().map_err(|_| Rejection::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
        assert_eq!(registry.accept(&key, &seal(&key, &advert(2, 10, Some(true))), t0), Ok(2));
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
        assert_eq!(registry.accept(&key, &seal(&key, &advert(2, 10, Some(true))), now), Ok(2));

        let forged = seal(&forger, &advert(2, 20, Some(false)));
        assert_eq!(registry.accept(&key, &forged, now), Err(Rejection::BadMac));
        let mut tampered = seal(&key, &advert(2, 30, Some(true)));
        tampered.body = advert(2, 30, Some(false)).encode_to_vec();
        assert_eq!(registry.accept(&key, &tampered, now), Err(Rejection::BadMac));
        let unsigned = v1::Signed { body: advert(2, 40, Some(false)).encode_to_vec(), mac: vec![] };
        assert_eq!(registry.accept(&key, &unsigned, now), Err(Rejection::BadMac));
        let garbage = v1::Signed { body: vec![0xff; 8], mac: key.sign(ADVERT_DOMAIN, &[0xff; 8]) };
        assert_eq!(registry.accept(&key, &garbage, now), Err(Rejection::Malformed));
        assert_eq!(
            registry.accept(&key, &seal(&key, &advert(1, 50, Some(false))), now),
            Err(Rejection::FromSelf)
        );
        assert_eq!(
            registry.accept(&key, &seal(&key, &advert(2, 10, Some(false))), now),
            Err(Rejection::Replay)
        );

        let entries = registry.snapshot().expect("readable");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[&2].advert, advert(2, 10, Some(true)));
    }

    #[test]
    fn an_older_peer_advert_without_the_field_reads_as_none() {
        let key = secret("the cluster secret of the test");
        let registry = PeerRegistry::new(1);
        let now = Instant::now();
        assert_eq!(registry.accept(&key, &seal(&key, &advert(3, 1, None)), now), Ok(3));
        assert_eq!(registry.snapshot().expect("readable")[&3].advert.journal_lease, None);
    }

    #[test]
    fn prune_keeps_members_and_recent_strangers() {
        let key = secret("the cluster secret of the test");
        let registry = PeerRegistry::new(1);
        let t0 = Instant::now();
        for node in [2, 3] {
            registry.accept(&key, &seal(&key, &advert(node, 1, Some(true))), t0).expect("valid");
        }
        registry.prune(&[1, 2], 10_000, t0 + Duration::from_secs(5));
        assert_eq!(registry.snapshot().expect("readable").len(), 2);
        registry.prune(&[1, 2], 10_000, t0 + Duration::from_secs(11));
        assert_eq!(registry.snapshot().expect("readable").keys().copied().collect::<Vec<_>>(), [2]);
    }
}
