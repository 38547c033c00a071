//! The cluster secret, the HMAC that authenticates peer messages (adverts
//! and bus claims), and the node proof that stands for a node certificate
//! on a cluster without TLS.
//!
//! Every node of one cluster must hold the same secret: from the
//! configuration, `LEASEHOLD_CLUSTER_SECRET`, or a file. A node started
//! without one generates a random secret and keeps it in its data
//! directory; it is never handed to anyone over the network, so a node
//! that is to join such a cluster must be given it (the file
//! `cluster-secret` in the first node's data directory).
//!
//! Without TLS a node proves it is one on every internal call (Raft, Peer,
//! Join) with the header [`NODE_PROOF_HEADER`]: its id and the HMAC of that
//! id under the secret. The proof is static, like a bearer token: it keeps
//! out whoever merely reaches the port, not whoever can read the traffic;
//! that is what TLS is for (docs/security.md).

use std::fmt;

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// Domain tag of an advert's MAC, so a signed bus message can never pass
/// for an advert or the other way round.
pub const ADVERT_DOMAIN: &[u8] = b"leasehold.advert.v1";
/// Domain tag of a bus message's MAC.
pub const BUS_DOMAIN: &[u8] = b"leasehold.bus.v1";
/// Domain tag of a node proof's MAC.
pub const NODE_PROOF_DOMAIN: &[u8] = b"leasehold.node-proof.v1";
/// The gRPC metadata key of a node proof (`ID.HEX-MAC`).
pub const NODE_PROOF_HEADER: &str = "leasehold-node-proof";
/// The gRPC metadata key naming the node a Raft call is meant for (its
/// id). A node refuses a call meant for another: openraft's messages do
/// not name their recipient, so a member's address that reaches another
/// node (a reused address, a stale name, a certificate every node shares)
/// would otherwise count that node's answer as the member's.
pub const TARGET_NODE_HEADER: &str = "leasehold-to";
/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;
/// Length of a generated secret, in bytes (printed as hex, twice as long).
const GENERATED_SECRET_BYTES: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// Why a secret cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    /// Too short to resist guessing.
    #[error("cluster secret: must be at least {MIN_SECRET_BYTES} bytes, got {0}")]
    TooShort(usize),
}

/// The cluster secret. Its `Debug` never prints the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret {
    key: Vec<u8>,
}

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterSecret({} bytes)", self.key.len())
    }
}

impl ClusterSecret {
    /// A secret from configured text (surrounding whitespace, e.g. a file's
    /// trailing newline, is not part of it).
    pub fn from_text(text: &str) -> Result<ClusterSecret, SecretError> {
        ClusterSecret::from_bytes(text.trim().as_bytes().to_vec())
    }

    /// A secret from raw bytes.
    pub fn from_bytes(key: Vec<u8>) -> Result<ClusterSecret, SecretError> {
        if key.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort(key.len()));
        }
        Ok(ClusterSecret { key })
    }

    /// A fresh random secret (hex text, so it can be printed and pasted into
    /// another node's configuration as it is).
    pub fn generate() -> ClusterSecret {
        let mut raw = [0u8; GENERATED_SECRET_BYTES];
        rand::thread_rng().fill_bytes(&mut raw);
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        ClusterSecret { key: hex.into_bytes() }
    }

    /// The key bytes (to keep in the data directory).
    pub fn as_bytes(&self) -> &[u8] {
        &self.key
    }

    /// The MAC of `body` under `domain`.
    pub fn sign(&self, domain: &[u8], body: &[u8]) -> Vec<u8> {
        self.mac(domain, body).finalize().into_bytes().to_vec()
    }

    /// Whether `mac` is the MAC of `body` under `domain` (constant time).
    pub fn verify(&self, domain: &[u8], body: &[u8], mac: &[u8]) -> bool {
        self.mac(domain, body).verify_slice(mac).is_ok()
    }

    /// The node proof of node `id`: `ID.HEX`, the HMAC of the id's decimal
    /// text under [`NODE_PROOF_DOMAIN`].
    pub fn node_proof(&self, id: u64) -> String {
        let mac = self.sign(NODE_PROOF_DOMAIN, id.to_string().as_bytes());
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        format!("{id}.{hex}")
    }

    /// The node id a proof states, when its MAC verifies (constant time).
    pub fn verify_node_proof(&self, proof: &str) -> Option<u64> {
        let (id, hex) = proof.trim().split_once('.')?;
        let id_number: u64 = id.parse().ok().filter(|id| *id >= 1)?;
        if id_number.to_string() != id || hex.len() != 64 || !hex.is_ascii() {
            return None;
        }
        let mac: Option<Vec<u8>> =
            (0..32).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()).collect();
        self.verify(NODE_PROOF_DOMAIN, id.as_bytes(), &mac?).then_some(id_number)
    }

    fn mac(&self, domain: &[u8], body: &[u8]) -> HmacSha256 {
        let mut mac =
            HmacSha256::new_from_slice(&self.key).expect("HMAC accepts keys of every length");
        mac.update(domain);
        mac.update(&[0]);
        mac.update(body);
        mac
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_body_verifies_and_any_change_does_not() -> Result<(), SecretError> {
        let secret = ClusterSecret::from_text("correct horse battery staple\n")?;
        let mac = secret.sign(ADVERT_DOMAIN, b"body");
        assert!(secret.verify(ADVERT_DOMAIN, b"body", &mac));
        assert!(!secret.verify(ADVERT_DOMAIN, b"bodz", &mac));
        assert!(!secret.verify(BUS_DOMAIN, b"body", &mac), "domains are separated");
        let other = ClusterSecret::from_text("another secret of some length")?;
        assert!(!other.verify(ADVERT_DOMAIN, b"body", &mac));
        assert!(!secret.verify(ADVERT_DOMAIN, b"body", &mac[..16]), "a truncated MAC fails");
        assert!(!secret.verify(ADVERT_DOMAIN, b"body", b""));
        Ok(())
    }

    #[test]
    fn a_node_proof_verifies_only_under_its_secret_and_for_its_id() -> Result<(), SecretError> {
        let secret = ClusterSecret::from_text("the cluster secret of one fleet")?;
        let proof = secret.node_proof(3);
        assert_eq!(secret.verify_node_proof(&proof), Some(3));
        let other = ClusterSecret::from_text("the cluster secret of another")?;
        assert_eq!(other.verify_node_proof(&proof), None);
        let (_, mac) = proof.split_once('.').unwrap_or_default();
        assert_eq!(secret.verify_node_proof(&format!("4.{mac}")), None, "bound to its id");
        assert_eq!(secret.verify_node_proof(&format!("03.{mac}")), None, "one spelling of the id");
        assert_eq!(secret.verify_node_proof(&format!("0.{mac}")), None);
        assert_eq!(secret.verify_node_proof("3"), None);
        assert_eq!(secret.verify_node_proof(&proof[..proof.len() - 2]), None);
        assert_eq!(secret.verify_node_proof(""), None);
        Ok(())
    }

    #[test]
    fn short_secrets_are_refused_and_generated_ones_differ() {
        assert_eq!(ClusterSecret::from_text(" short "), Err(SecretError::TooShort(5)));
        let (a, b) = (ClusterSecret::generate(), ClusterSecret::generate());
        assert_ne!(a, b);
        assert_eq!(a.as_bytes().len(), 2 * GENERATED_SECRET_BYTES);
        assert!(!format!("{a:?}").contains(&String::from_utf8_lossy(a.as_bytes()).to_string()));
    }
}
