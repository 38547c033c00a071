//! The cutover gate: a pure decision, made once per claim, of whether this
//! node uses the replicated journal lease or the best-effort broadcast (bus)
//! path. The pool moves to the journal only when every peer agrees, so a
//! mixed-version pool never runs one job on both paths.
//!
//! Rules (SPEC §4), in the order they are checked:
//!
//! 1. this node's `journal_lease` flag off → bus;
//! 2. a failed read of membership or the peer registry → bus;
//! 3. every other known member, in id order, must be capable:
//!    - never heard from (no advert) → bus: it may be an old version;
//!    - an advert older than `stale_after_ms` → bus: too old to trust;
//!    - an advert without the `journal_lease` field (an older peer) → bus;
//!    - `journal_lease = false` → bus;
//!    - a member that is offline (advert older than 3 heartbeat
//!      intervals) but whose last advert is recent enough to trust counts
//!      by that advert, so an old peer that rejoins cannot find the pool
//!      split;
//! 4. no other members → journal (coherence holds vacuously);
//! 5. dry-run on → bus, with `intended` saying what rules 1-4 chose.
//!
//! Every decision names the peer and the fact that decided it.
//!
//! A flag change is not acted on at the instant it is made: each side of a
//! change (this node's flags, a peer's advertised capability) counts from
//! `since + settle`, where `settle` is three heartbeat intervals. Every node
//! hears the change well within that time, so every node evaluates a given
//! tick instant with the same facts and the pool switches paths at one tick
//! rather than one node at a time ([`value_at`]).

use std::fmt;

/// This node's gate flags, read live at each claim.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateFlags {
    /// Use the journal lease when the pool agrees.
    pub journal_lease: bool,
    /// Log the intended journal claims but stay on the bus.
    pub journal_lease_dry_run: bool,
}

impl GateFlags {
    /// What this node advertises: capable only with the flag on and dry-run
    /// off.
    pub fn advertised_journal_lease(self) -> bool {
        self.journal_lease && !self.journal_lease_dry_run
    }
}

/// A value that changed at `since_ms` from `before`: which of the two counts
/// at `at_ms`, when a change takes effect `settle_ms` after it was made.
/// Before the change is settled the old value holds, so a node that has
/// already heard of a change and one that has not yet decide alike.
pub fn value_at<T: Copy>(current: T, before: T, since_ms: u64, settle_ms: u64, at_ms: u64) -> T {
    if at_ms >= since_ms.saturating_add(settle_ms) { current } else { before }
}

/// The last authenticated advert of a peer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Advert {
    /// The peer's version string.
    pub version: String,
    /// `None`: the peer's advert has no such field (an older version).
    pub journal_lease: Option<bool>,
    /// Whether the peer drains.
    pub draining: bool,
}

/// One known member as the gate sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Node id.
    pub node: u64,
    /// Its last authenticated advert and that advert's age, if any.
    pub advert: Option<(Advert, u64)>,
}

/// Everything the gate decides from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GateInput {
    /// This node.
    pub node: u64,
    /// This node's flags.
    pub flags: GateFlags,
    /// Every known member (Raft membership and peer registry); this node
    /// may be among them and is skipped.
    pub members: Vec<Member>,
    /// A read of membership or the registry that failed, and what it was.
    pub read_failure: Option<String>,
    /// Heartbeat interval: a peer is online while its advert is younger
    /// than 3 intervals.
    pub heartbeat_interval_ms: u64,
    /// An advert older than this is too old to count at all.
    pub stale_after_ms: u64,
}

/// One of the two claim mechanisms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClaimPath {
    /// The replicated, epoch-fenced journal lease.
    Journal,
    /// The best-effort broadcast.
    Bus,
}

impl ClaimPath {
    /// Lower-case name for status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimPath::Journal => "journal",
            ClaimPath::Bus => "bus",
        }
    }
}

/// The fact that decided a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// This node's `journal_lease` flag is off.
    FlagOff,
    /// A read failed.
    ReadFailed(String),
    /// A member never sent a valid advert.
    NeverHeard(u64),
    /// A member's last advert is too old to trust.
    Stale {
        /// The member.
        node: u64,
        /// Its advert's age.
        age_ms: u64,
    },
    /// A member's advert has no `journal_lease` field (an older peer).
    NoField(u64),
    /// A member advertises `journal_lease = false`.
    Incapable {
        /// The member.
        node: u64,
        /// Whether it is online (else it counts by its last advert).
        online: bool,
    },
    /// Every other member advertises `journal_lease = true`.
    AllCapable(usize),
    /// There are no other members.
    NoPeers,
    /// Dry-run is on; the inner reason is what decided the intended path.
    DryRun(Box<Reason>),
}

impl Reason {
    /// A short stable label for metrics (`flag_off`, `never_heard`, …).
    pub fn label(&self) -> &'static str {
        match self {
            Reason::FlagOff => "flag_off",
            Reason::ReadFailed(_) => "read_failed",
            Reason::NeverHeard(_) => "never_heard",
            Reason::Stale { .. } => "stale_advert",
            Reason::NoField(_) => "older_peer",
            Reason::Incapable { .. } => "peer_incapable",
            Reason::AllCapable(_) => "all_capable",
            Reason::NoPeers => "no_peers",
            Reason::DryRun(_) => "dry_run",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::FlagOff => write!(f, "journal_lease is off on this node"),
            Reason::ReadFailed(what) => write!(f, "read failed: {what}"),
            Reason::NeverHeard(node) => write!(f, "peer {node} was never heard from"),
            Reason::Stale { node, age_ms } => {
                write!(f, "peer {node}'s last advert is {age_ms} ms old, too old to trust")
            }
            Reason::NoField(node) => {
                write!(f, "peer {node} advertises no journal_lease field (older version)")
            }
            Reason::Incapable { node, online: true } => {
                write!(f, "peer {node} advertises journal_lease=false")
            }
            Reason::Incapable { node, online: false } => {
                write!(f, "peer {node} is offline and last advertised journal_lease=false")
            }
            Reason::AllCapable(peers) => {
                write!(f, "all {peers} peers advertise journal_lease=true")
            }
            Reason::NoPeers => write!(f, "no peers"),
            Reason::DryRun(inner) => write!(f, "dry-run (would decide: {inner})"),
        }
    }
}

/// The gate's answer: exactly one path, why, and what a non-dry-run would
/// have chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The path to use for this claim.
    pub path: ClaimPath,
    /// The fact that decided it.
    pub reason: Reason,
    /// The path rules 1-4 chose (differs from `path` only under dry-run).
    pub intended: ClaimPath,
}

/// Decides the claim path. Pure: the same input always gives the same
/// decision.
pub fn decide_claim_path(input: &GateInput) -> Decision {
    let bus = |reason: Reason| Decision { path: ClaimPath::Bus, reason, intended: ClaimPath::Bus };
    if !input.flags.journal_lease {
        return bus(Reason::FlagOff);
    }
    let pool = pool_decision(input);
    if input.flags.journal_lease_dry_run {
        return Decision {
            path: ClaimPath::Bus,
            intended: pool.path,
            reason: Reason::DryRun(Box::new(pool.reason)),
        };
    }
    pool
}

/// Rules 2-4: whether the pool agrees on the journal.
fn pool_decision(input: &GateInput) -> Decision {
    let bus = |reason: Reason| Decision { path: ClaimPath::Bus, reason, intended: ClaimPath::Bus };
    if let Some(what) = &input.read_failure {
        return bus(Reason::ReadFailed(what.clone()));
    }
    let mut peers: Vec<&Member> = input.members.iter().filter(|m| m.node != input.node).collect();
    // A member may be listed twice (from membership and from the registry);
    // every entry is checked, so the least capable view of it decides.
    peers.sort_by_key(|m| m.node);
    let online_within_ms = input.heartbeat_interval_ms.saturating_mul(3);
    for peer in &peers {
        let Some((advert, age_ms)) = &peer.advert else {
            return bus(Reason::NeverHeard(peer.node));
        };
        if *age_ms >= input.stale_after_ms {
            return bus(Reason::Stale { node: peer.node, age_ms: *age_ms });
        }
        match advert.journal_lease {
            None => return bus(Reason::NoField(peer.node)),
            Some(false) => {
                return bus(Reason::Incapable {
                    node: peer.node,
                    online: *age_ms < online_within_ms,
                });
            }
            Some(true) => {}
        }
    }
    let mut distinct: Vec<u64> = peers.iter().map(|m| m.node).collect();
    distinct.dedup();
    let reason =
        if distinct.is_empty() { Reason::NoPeers } else { Reason::AllCapable(distinct.len()) };
    Decision { path: ClaimPath::Journal, reason, intended: ClaimPath::Journal }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL_MS: u64 = 1_000;

    fn capable(node: u64, age_ms: u64) -> Member {
        let advert = Advert { version: "1".into(), journal_lease: Some(true), draining: false };
        Member { node, advert: Some((advert, age_ms)) }
    }

    fn input(members: Vec<Member>) -> GateInput {
        GateInput {
            node: 1,
            flags: GateFlags { journal_lease: true, journal_lease_dry_run: false },
            members,
            read_failure: None,
            heartbeat_interval_ms: INTERVAL_MS,
            stale_after_ms: 30_000,
        }
    }

    fn with_advert(node: u64, journal_lease: Option<bool>, age_ms: u64) -> Member {
        let advert = Advert { version: "0".into(), journal_lease, draining: false };
        Member { node, advert: Some((advert, age_ms)) }
    }

    #[test]
    fn all_capable_goes_to_the_journal() {
        let decision =
            decide_claim_path(&input(vec![capable(1, 0), capable(2, 100), capable(3, 900)]));
        assert_eq!(decision.path, ClaimPath::Journal);
        assert_eq!(decision.intended, ClaimPath::Journal);
        assert_eq!(decision.reason, Reason::AllCapable(2));
    }

    #[test]
    fn no_peers_is_vacuously_coherent() {
        let decision = decide_claim_path(&input(vec![capable(1, 0)]));
        assert_eq!((decision.path, decision.reason), (ClaimPath::Journal, Reason::NoPeers));
    }

    #[test]
    fn flag_off_is_bus() {
        let mut gate = input(vec![capable(2, 0)]);
        gate.flags.journal_lease = false;
        let decision = decide_claim_path(&gate);
        assert_eq!(
            (decision.path, decision.intended, decision.reason),
            (ClaimPath::Bus, ClaimPath::Bus, Reason::FlagOff)
        );
    }

    #[test]
    fn an_older_peer_without_the_field_keeps_the_pool_on_bus() {
        let decision = decide_claim_path(&input(vec![capable(2, 0), with_advert(3, None, 0)]));
        assert_eq!((decision.path, decision.reason), (ClaimPath::Bus, Reason::NoField(3)));
    }

    #[test]
    fn a_stale_advert_keeps_the_pool_on_bus() {
        let decision = decide_claim_path(&input(vec![capable(2, 0), capable(3, 30_000)]));
        assert_eq!(
            (decision.path, decision.reason),
            (ClaimPath::Bus, Reason::Stale { node: 3, age_ms: 30_000 })
        );
    }

    #[test]
    fn a_read_failure_keeps_the_pool_on_bus() {
        let mut gate = input(vec![capable(2, 0)]);
        gate.read_failure = Some("membership".into());
        let decision = decide_claim_path(&gate);
        assert_eq!(
            (decision.path, decision.reason),
            (ClaimPath::Bus, Reason::ReadFailed("membership".into()))
        );
    }

    #[test]
    fn an_offline_member_counts_by_its_last_advert() {
        // Offline (older than 3 intervals) but recent enough to trust.
        let incapable = decide_claim_path(&input(vec![with_advert(2, Some(false), 5_000)]));
        assert_eq!(
            (incapable.path, incapable.reason),
            (ClaimPath::Bus, Reason::Incapable { node: 2, online: false })
        );
        let still_capable = decide_claim_path(&input(vec![capable(2, 5_000)]));
        assert_eq!(still_capable.path, ClaimPath::Journal);
    }

    #[test]
    fn a_member_never_heard_from_is_not_capable() {
        let decision =
            decide_claim_path(&input(vec![capable(2, 0), Member { node: 3, advert: None }]));
        assert_eq!((decision.path, decision.reason), (ClaimPath::Bus, Reason::NeverHeard(3)));
    }

    #[test]
    fn dry_run_stays_on_bus_and_says_it_would_go_to_the_journal() {
        let mut gate = input(vec![capable(2, 0)]);
        gate.flags.journal_lease_dry_run = true;
        let decision = decide_claim_path(&gate);
        assert_eq!(decision.path, ClaimPath::Bus);
        assert_eq!(decision.intended, ClaimPath::Journal);
        assert_eq!(decision.reason, Reason::DryRun(Box::new(Reason::AllCapable(1))));
        assert!(!gate.flags.advertised_journal_lease());
    }

    #[test]
    fn an_offline_older_peer_keeps_the_pool_on_bus() {
        // Offline (5 s > 3 intervals) and without the field: it counts by
        // that advert, so the pool cannot split when it rejoins.
        let decision = decide_claim_path(&input(vec![capable(2, 0), with_advert(3, None, 5_000)]));
        assert_eq!((decision.path, decision.reason), (ClaimPath::Bus, Reason::NoField(3)));
    }

    #[test]
    fn dry_run_with_an_incapable_peer_intends_bus() {
        let mut gate = input(vec![with_advert(2, Some(false), 0)]);
        gate.flags.journal_lease_dry_run = true;
        let decision = decide_claim_path(&gate);
        assert_eq!((decision.path, decision.intended), (ClaimPath::Bus, ClaimPath::Bus));
        assert_eq!(
            decision.reason,
            Reason::DryRun(Box::new(Reason::Incapable { node: 2, online: true }))
        );
    }

    #[test]
    fn flag_off_wins_over_dry_run_and_peers() {
        let mut gate = input(vec![capable(2, 0)]);
        gate.flags = GateFlags { journal_lease: false, journal_lease_dry_run: true };
        let decision = decide_claim_path(&gate);
        assert_eq!(
            (decision.path, decision.intended, decision.reason),
            (ClaimPath::Bus, ClaimPath::Bus, Reason::FlagOff)
        );
        assert!(!gate.flags.advertised_journal_lease());
    }

    #[test]
    fn one_incapable_peer_among_many_decides_and_is_named() {
        let decision = decide_claim_path(&input(vec![
            capable(2, 0),
            with_advert(3, Some(false), 200),
            capable(4, 0),
        ]));
        assert_eq!(
            (decision.path, decision.reason),
            (ClaimPath::Bus, Reason::Incapable { node: 3, online: true })
        );
    }

    #[test]
    fn only_the_flag_on_and_dry_run_off_advertises_capability() {
        let flags = |journal_lease, journal_lease_dry_run| GateFlags {
            journal_lease,
            journal_lease_dry_run,
        };
        assert!(flags(true, false).advertised_journal_lease());
        assert!(!flags(true, true).advertised_journal_lease());
        assert!(!flags(false, false).advertised_journal_lease());
        assert!(!flags(false, true).advertised_journal_lease());
    }

    #[test]
    fn a_change_counts_once_settled() {
        // Changed from false to true at 10 s, settling in 3 s.
        assert!(!value_at(true, false, 10_000, 3_000, 10_000));
        assert!(!value_at(true, false, 10_000, 3_000, 12_999));
        assert!(value_at(true, false, 10_000, 3_000, 13_000));
        // Never changed (since 0): the current value holds from the start.
        assert!(value_at(true, false, 0, 3_000, 3_000));
        assert!(value_at(true, false, u64::MAX, 3_000, u64::MAX));
    }

    #[test]
    fn the_deciding_peer_is_named() {
        let decision = decide_claim_path(&input(vec![with_advert(4, Some(false), 100)]));
        assert_eq!(decision.reason.to_string(), "peer 4 advertises journal_lease=false");
        assert_eq!(decision.reason.label(), "peer_incapable");
    }
}
