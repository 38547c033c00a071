//! The internal Peer service's bad requests: adverts and bus messages that
//! are signed with the cluster secret (so the MAC is not what refuses
//! them, unless a case is about the MAC) but carry a body that is not
//! valid. Every case speaks as [`PROBE_NODE`] unless it says otherwise.

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Result, anyhow};
use leasehold_proto::v1;
use leasehold_security::secret::{ADVERT_DOMAIN, BUS_DOMAIN};
use prost::Message;
use tonic::Code;

use super::wire::rpc;
use super::{Case, NODE_ID, PROBE_NODE};
use crate::e2e::support::CLUSTER_SECRET;

/// The key every bus case names, so the story can check afterwards that
/// none of them left a claim on it.
pub const BUS_KEY: &str = "cron:bad-input:1";
/// Longest text field of a peer message the node keeps (bytes).
const MAX_TEXT_BYTES: usize = 256;

fn sign(domain: &[u8], body: Vec<u8>) -> v1::Signed {
    let mac = leasehold_security::ClusterSecret::from_text(CLUSTER_SECRET)
        .map(|secret| secret.sign(domain, &body))
        .unwrap_or_default();
    v1::Signed { body, mac }
}

/// `body`, signed as an advert with the cluster secret.
pub fn signed_advert_body(body: &[u8]) -> v1::Signed {
    sign(ADVERT_DOMAIN, body.to_vec())
}

/// `message`, signed as a bus message with the cluster secret.
pub fn signed_bus(message: &v1::BusMessage) -> v1::Signed {
    sign(BUS_DOMAIN, message.encode_to_vec())
}

/// Now on this machine's clock, Unix ms.
pub fn unix_ms() -> Result<u64> {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).map_err(|e| anyhow!("clock: {e}"))?;
    Ok(u64::try_from(since.as_millis())?)
}

/// A bus claim of [`BUS_KEY`] by `node` at `at_ms`.
pub fn claim(node: u64, at_ms: u64) -> v1::BusMessage {
    let claim = v1::BusClaim { key: BUS_KEY.to_string(), node, at_ms };
    v1::BusMessage { kind: Some(v1::bus_message::Kind::Claim(claim)) }
}

fn release(key: &str, node: u64, at_ms: u64) -> v1::BusMessage {
    let release = v1::BusRelease { key: key.to_string(), node, at_ms };
    v1::BusMessage { kind: Some(v1::bus_message::Kind::Release(release)) }
}

/// The Peer cases.
pub fn cases() -> Result<Vec<Case>> {
    use Code::{
        InvalidArgument as Invalid, PermissionDenied, ResourceExhausted as TooLarge,
        Unauthenticated,
    };
    let bad = Case::malformed;
    let now_ms = unix_ms()?;
    let advert = |node_id: u64| v1::Advert {
        node_id,
        version: "0.0.0-probe".into(),
        journal_lease: Some(false),
        role: "follower".into(),
        sent_at_ms: now_ms,
        ..Default::default()
    };
    let advertise =
        |advert: v1::Advert| rpc::advertise(signed_advert_body(&advert.encode_to_vec()));
    let bus = |message: v1::BusMessage| rpc::bus(signed_bus(&message));
    let long_text = "v".repeat(MAX_TEXT_BYTES + 1);
    let long_key = format!("cron:{}:1", "k".repeat(MAX_TEXT_BYTES));
    let claim_of = |key: &str| {
        let claim = v1::BusClaim { key: key.to_string(), node: PROBE_NODE, at_ms: now_ms };
        v1::BusMessage { kind: Some(v1::bus_message::Kind::Claim(claim)) }
    };
    let mut cases = vec![
        // Advertise
        bad(
            "advertise: a body that is no advert",
            rpc::advertise(signed_advert_body(b"\xff\xff\xff\xff")),
            Invalid,
            "body",
        ),
        bad(
            "advertise: an empty body (no node id)",
            rpc::advertise(signed_advert_body(b"")),
            Invalid,
            "body.node_id",
        ),
        bad(
            "advertise: no mac",
            rpc::advertise(v1::Signed { body: advert(PROBE_NODE).encode_to_vec(), mac: vec![] }),
            Unauthenticated,
            "mac",
        ),
        bad(
            "advertise: a mac over another body",
            rpc::advertise(v1::Signed {
                body: advert(PROBE_NODE).encode_to_vec(),
                mac: signed_advert_body(b"another body").mac,
            }),
            Unauthenticated,
            "mac",
        ),
        bad(
            "advertise: an advert from the receiving node itself",
            advertise(advert(NODE_ID)),
            Invalid,
            "body.node_id",
        )
        .sent_by(NODE_ID),
        bad(
            "advertise: an advert speaking for another node",
            advertise(advert(PROBE_NODE + 1)),
            PermissionDenied,
            "body.node_id",
        ),
        Case::too_large(
            "advertise: a 257-byte version",
            advertise(v1::Advert { version: long_text.clone(), ..advert(PROBE_NODE) }),
            TooLarge,
            "body.version",
        ),
        Case::too_large(
            "advertise: a 257-byte role",
            advertise(v1::Advert { role: long_text.clone(), ..advert(PROBE_NODE) }),
            TooLarge,
            "body.role",
        ),
        // Bus
        bad(
            "bus: a body that is no bus message",
            rpc::bus(sign(BUS_DOMAIN, b"\xff\xff\xff\xff".to_vec())),
            Invalid,
            "body",
        ),
        bad(
            "bus: a message that is neither claim nor release",
            bus(v1::BusMessage { kind: None }),
            Invalid,
            "body.kind",
        ),
        bad(
            "bus: no mac",
            rpc::bus(v1::Signed { body: claim(PROBE_NODE, now_ms).encode_to_vec(), mac: vec![] }),
            Unauthenticated,
            "mac",
        ),
        bad(
            "bus: an advert's mac on a bus message",
            rpc::bus(sign(ADVERT_DOMAIN, claim(PROBE_NODE, now_ms).encode_to_vec())),
            Unauthenticated,
            "mac",
        ),
        bad(
            "bus: a claim speaking for another node",
            bus(claim(PROBE_NODE + 1, now_ms)),
            PermissionDenied,
            "body.node",
        ),
        bad("bus: a claim at 0", bus(claim(PROBE_NODE, 0)), Invalid, "body.at_ms"),
        bad(
            "bus: a claim 11 minutes ahead",
            bus(claim(PROBE_NODE, now_ms + 11 * 60 * 1_000)),
            Invalid,
            "body.at_ms",
        ),
        bad("bus: a claim of an empty key", bus(claim_of("")), Invalid, "body.claim.key"),
        Case::too_large(
            "bus: a claim of a 263-byte key",
            bus(claim_of(&long_key)),
            TooLarge,
            "body.claim.key",
        ),
        bad(
            "bus: a release of an empty key",
            bus(release("", PROBE_NODE, now_ms)),
            Invalid,
            "body.release.key",
        ),
        bad(
            "bus: a release speaking for another node",
            bus(release(BUS_KEY, PROBE_NODE + 1, now_ms)),
            PermissionDenied,
            "body.node",
        ),
    ];
    // Both RPCs: a message over the 64 KiB limit (each would otherwise be
    // taken: a valid advert, a valid claim), and bytes that are no message.
    for call in [advertise(advert(PROBE_NODE)), bus(claim(PROBE_NODE, now_ms))] {
        cases.push(Case::garbage(call.path));
        cases.push(Case::over_limit(call));
    }
    Ok(cases)
}
