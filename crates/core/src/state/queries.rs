//! Read-only questions the node asks of the state: which leases a holder
//! has, and which members a `target = each` tick goes to. Pure, so the node
//! asks and core decides.

use super::State;

impl State {
    /// The leases held by `holder` (job id, token), in job order; with
    /// `key`, only those on the job with that idempotency key. Walks the
    /// claimed jobs only (the lease-expiry index), never the whole table.
    pub fn leases_held_by(&self, holder: &str, key: Option<&str>) -> Vec<(u64, u64)> {
        let mut held: Vec<(u64, u64)> = self
            .indexes
            .expiries
            .iter()
            .filter_map(|&(_, job_id)| Some((job_id, self.jobs.get(&job_id)?)))
            .filter(|(_, job)| key.is_none_or(|key| job.idempotency_key() == Some(key)))
            .filter_map(|(job_id, job)| {
                job.lease().filter(|lease| lease.holder == holder).map(|l| (job_id, l.token))
            })
            .collect();
        held.sort_unstable();
        held
    }

    /// The members a `target = each` tick whose job carries `tags` goes to:
    /// those of `members` that registered with this state, are not
    /// draining, and carry every one of `tags`. In id order.
    pub fn each_targets(&self, members: &[u64], tags: &[String]) -> Vec<u64> {
        self.members_with(members, tags, false)
    }

    /// Of `members`, the registered ones with every tag in `tags` that are
    /// draining: they would run a `target = each` tick but take none now.
    pub fn each_draining(&self, members: &[u64], tags: &[String]) -> Vec<u64> {
        self.members_with(members, tags, true)
    }

    /// Of `members`, the registered ones with every tag in `tags` whose
    /// draining mark is `draining`, sorted, once each.
    fn members_with(&self, members: &[u64], tags: &[String], draining: bool) -> Vec<u64> {
        let mut found: Vec<u64> = members
            .iter()
            .copied()
            .filter(|id| {
                self.nodes.get(id).is_some_and(|node| {
                    node.draining == draining && tags.iter().all(|tag| node.tags.contains(tag))
                })
            })
            .collect();
        found.sort_unstable();
        found.dedup();
        found
    }

    /// The voter a leader hands leadership to when it must stop leading (it
    /// drains, or its clock is beyond the bound): of `matched` (each other
    /// voter with the index of the last log entry it holds, as the leader's
    /// replication reports it), the most caught-up one that is not `me` and
    /// not draining here; ties go to the lower id. `None` when no voter
    /// qualifies. The most caught-up voter is the one whose election the
    /// others' logs cannot refuse.
    pub fn successor(&self, me: u64, matched: &[(u64, u64)]) -> Option<u64> {
        matched
            .iter()
            .filter(|(id, _)| *id != me && !self.nodes.get(id).is_some_and(|node| node.draining))
            .max_by_key(|(id, index)| (*index, std::cmp::Reverse(*id)))
            .map(|(id, _)| *id)
    }
}

#[cfg(test)]
mod tests {
    use crate::command::{Command, Proposal};
    use crate::job::JobSpec;
    use crate::state::State;

    fn apply(state: &mut State, command: Command) {
        state.apply(1, &Proposal { now_ms: 1_000, command });
    }

    fn claim(state: &mut State, worker: &str) {
        let command = Command::Claim {
            worker: worker.into(),
            queue: "q".into(),
            max: 1,
            lease_ttl_ms: None,
            selector: vec![],
        };
        apply(state, command);
    }

    #[test]
    fn held_leases_are_the_holders_own_and_filter_by_key() {
        let mut state = State::new();
        let spec = |key: &str| JobSpec {
            queue: "q".into(),
            idempotency_key: Some(key.into()),
            ..JobSpec::default()
        };
        apply(&mut state, Command::Enqueue { jobs: vec![spec("a"), spec("b"), spec("c")] });
        claim(&mut state, "node-1");
        claim(&mut state, "node-2");
        claim(&mut state, "node-1");
        assert_eq!(state.leases_held_by("node-1", None), vec![(1, 1), (3, 3)]);
        assert_eq!(state.leases_held_by("node-2", None), vec![(2, 2)]);
        assert_eq!(state.leases_held_by("node-1", Some("c")), vec![(3, 3)]);
        assert_eq!(state.leases_held_by("node-1", Some("b")), vec![], "b is node 2's");
        assert_eq!(state.leases_held_by("node-9", None), vec![]);
        apply(&mut state, Command::Ack { job_id: 3, token: 3, result: None });
        assert_eq!(state.leases_held_by("node-1", None), vec![(1, 1)], "an acked job is not held");
    }

    #[test]
    fn each_targets_are_registered_undrained_members_with_every_tag() {
        let mut state = State::new();
        let register = |state: &mut State, node, tags: &[&str]| {
            let tags = tags.iter().map(|t| t.to_string()).collect();
            apply(state, Command::RegisterNode { node, tags });
        };
        register(&mut state, 1, &["gpu", "eu"]);
        register(&mut state, 2, &["eu"]);
        register(&mut state, 3, &["gpu", "eu"]);
        register(&mut state, 5, &["gpu", "eu"]);
        apply(&mut state, Command::SetDraining { node: 3, draining: true });
        let members = [3, 1, 2, 4];
        let tags = |t: &[&str]| t.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert_eq!(
            state.each_targets(&members, &tags(&["gpu"])),
            vec![1],
            "3 drains, 5 is no member"
        );
        assert_eq!(state.each_targets(&members, &tags(&["eu"])), vec![1, 2]);
        assert_eq!(state.each_targets(&members, &[]), vec![1, 2], "4 never registered");
        assert_eq!(state.each_targets(&[], &[]), Vec::<u64>::new());
        // The draining member with the tags is away, not gone.
        assert_eq!(state.each_draining(&members, &tags(&["gpu"])), vec![3]);
        assert_eq!(state.each_draining(&members, &tags(&["eu", "x"])), Vec::<u64>::new());
        assert_eq!(state.each_draining(&[1, 2], &[]), Vec::<u64>::new(), "3 is no member");
    }

    #[test]
    fn the_successor_is_the_most_caught_up_voter_that_is_not_draining() {
        let mut state = State::new();
        // Node 1 leads; 2 and 4 hold everything, 3 lags.
        let matched = [(2, 40), (3, 39), (4, 40), (1, 41)];
        assert_eq!(state.successor(1, &matched), Some(2), "ties go to the lower id");
        apply(&mut state, Command::SetDraining { node: 2, draining: true });
        assert_eq!(state.successor(1, &matched), Some(4), "2 drains");
        apply(&mut state, Command::SetDraining { node: 4, draining: true });
        assert_eq!(state.successor(1, &matched), Some(3), "the laggard is all that is left");
        assert_eq!(state.successor(3, &[(3, 50)]), None, "never the leader itself");
        assert_eq!(state.successor(1, &[]), None);
    }
}
