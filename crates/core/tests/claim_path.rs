//! Property test of the cutover gate: the journal is chosen only when every
//! rule allows it, whatever the input; and the decision is a pure function.

use leasehold_core::claim_path::{
    Advert, ClaimPath, GateFlags, GateInput, Member, decide_claim_path,
};
use proptest::prelude::*;

fn member() -> impl Strategy<Value = Member> {
    (1u64..6, proptest::option::of((proptest::option::of(any::<bool>()), 0u64..40_000))).prop_map(
        |(node, advert)| Member {
            node,
            advert: advert.map(|(journal_lease, age_ms)| {
                (Advert { version: "v".into(), journal_lease, draining: false }, age_ms)
            }),
        },
    )
}

fn gate_input() -> impl Strategy<Value = GateInput> {
    (
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(member(), 0..6),
        proptest::option::of("[a-z]{1,8}"),
    )
        .prop_map(|(journal_lease, dry_run, members, read_failure)| GateInput {
            node: 1,
            flags: GateFlags { journal_lease, journal_lease_dry_run: dry_run },
            members,
            read_failure,
            heartbeat_interval_ms: 1_000,
            stale_after_ms: 30_000,
        })
}

proptest! {
    #[test]
    fn journal_only_when_every_rule_allows(input in gate_input()) {
        let decision = decide_claim_path(&input);
        let every_peer_capable = input.members.iter().filter(|m| m.node != input.node).all(|m| {
            matches!(&m.advert, Some((advert, age_ms)) if advert.journal_lease == Some(true) && *age_ms < input.stale_after_ms)
        });
        let allowed = input.flags.journal_lease
            && !input.flags.journal_lease_dry_run
            && input.read_failure.is_none()
            && every_peer_capable;
        prop_assert_eq!(decision.path == ClaimPath::Journal, allowed, "{:?}", decision);
        // Dry-run never claims on the journal but reports the intent.
        if input.flags.journal_lease_dry_run {
            prop_assert_eq!(decision.path, ClaimPath::Bus);
        } else {
            prop_assert_eq!(decision.path, decision.intended);
        }
        prop_assert_eq!(decide_claim_path(&input), decision);
    }
}
