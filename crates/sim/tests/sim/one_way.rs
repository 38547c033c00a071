//! Goal: a one-way cut loses the messages of one direction and no others,
//! as a one-way loss does to an exchange on an open connection. Method: run
//! short plans whose only fault is the cut, and compare the two ends of
//! the link as Raft's metrics show them when it was cut and when it was
//! repaired.
//! - Follower → leader: the leader's appends still reach the follower and
//!   take effect there, but the follower's answers are lost (the leader's
//!   record of what it holds does not move). openraft waits before it
//!   retries an unanswered append, so the follower may hear too little and
//!   campaign, and then refuses the leader's later appends for its newer
//!   term: whether its log grows first depends on the seed's timing, so
//!   the test asks that in at least one of its seeds.
//! - Leader → follower: the follower hears nothing and campaigns; its vote
//!   requests reach the leader, whose answers are lost.
//!
//! Each side counts what the cut lost in each direction; a cut both ways
//! or none fails both tests.

use leasehold_sim::cluster::{LinkView, OneWay, Plan, Run, run};
use leasehold_sim::net::Lost;

fn cut_only(seed: u64, way: OneWay) -> Plan {
    Plan {
        partition_leader: false,
        crash_follower: false,
        power_cut: false,
        clock_jump_ms: None,
        handover: false,
        link_failures_per_million: 0,
        one_way: Some(way),
        ..Plan::short(seed)
    }
}

fn views(plan: &Plan, record: &Run) -> (LinkView, LinkView) {
    assert_eq!(record.failures(), Vec::<String>::new(), "seed {}", plan.seed);
    match record.one_way_views.as_slice() {
        [cut, repair] if cut.cut && !repair.cut => (cut.clone(), repair.clone()),
        other => panic!("seed {}: expected a cut and a repair, got {other:?}", plan.seed),
    }
}

#[test]
fn a_follower_cut_towards_the_leader_receives_but_is_not_heard() -> anyhow::Result<()> {
    let mut grew = Vec::new();
    for seed in 1..=3 {
        let plan = cut_only(seed, OneWay::FollowerToLeader);
        let record = run(&plan)?;
        let (cut, repair) = views(&plan, &record);
        if repair.follower_last_log > cut.follower_last_log {
            grew.push(seed);
        } else {
            // Its log stood still only because it campaigned and refused
            // the leader's appends for its newer term.
            assert!(
                repair.follower_term > cut.follower_term,
                "seed {seed}: the follower neither took an append nor campaigned: {cut:?} then \
                 {repair:?}"
            );
        }
        // Each lost answer is the follower's to a request of the leader's
        // that reached it and was served there (taken, or refused for a
        // newer term).
        assert!(
            repair.lost_to_leader.answers > 0,
            "seed {seed}: no answer of the follower was lost: {repair:?}"
        );
        assert_eq!(
            repair.lost_to_follower,
            Lost::default(),
            "seed {seed}: the other direction lost messages: {repair:?}"
        );
        assert!(
            repair.leader_matched.is_some(),
            "seed {seed}: the leader lost its lead: {repair:?}"
        );
        assert_eq!(
            repair.leader_matched, cut.leader_matched,
            "seed {seed}: the leader heard the cut follower: {cut:?} then {repair:?}"
        );
    }
    assert!(!grew.is_empty(), "in no seed did the cut follower's log grow during the cut");
    Ok(())
}

#[test]
fn a_leader_cut_towards_a_follower_still_receives_its_campaign() -> anyhow::Result<()> {
    for seed in 1..=3 {
        let plan = cut_only(seed, OneWay::LeaderToFollower);
        let record = run(&plan)?;
        let (cut, repair) = views(&plan, &record);
        assert!(
            repair.lost_to_follower.requests > 0,
            "seed {seed}: no request of the leader was lost: {repair:?}"
        );
        assert!(
            repair.follower_term > cut.follower_term,
            "seed {seed}: the cut-off follower did not campaign: {cut:?} then {repair:?}"
        );
        // The follower's vote requests reach the leader, which answers
        // them (openraft's leader lease refuses them); the answers are
        // what is lost.
        assert!(
            repair.lost_to_follower.answers > 0,
            "seed {seed}: the follower's requests did not reach the leader: {repair:?}"
        );
        assert_eq!(
            repair.lost_to_leader,
            Lost::default(),
            "seed {seed}: the other direction lost messages: {repair:?}"
        );
    }
    Ok(())
}
