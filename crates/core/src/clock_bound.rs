//! Whether this node's clock may be trusted, judged from its measured
//! offsets to the other voters: the pure half of the enforced clock bound
//! (`max_clock_offset_ms`, SPEC §7.7). The node runtime measures (with
//! round-trip-bounded timestamps on its adverts) and acts on the verdict
//! (readiness, elections, stamping); this decides.
//!
//! A peer *agrees* when the offset is within the bound even at the far end
//! of the measurement's uncertainty (`|offset| + uncertainty <= bound`),
//! and *disagrees* when it is beyond the bound even at the near end
//! (`|offset| - uncertainty > bound`); anything else, or no measurement,
//! says nothing. This node counts as agreeing with itself when it is a
//! voter. Its clock is:
//!
//! - **agreed** when a majority of the voters agree with it (a one-voter
//!   cluster agrees with itself);
//! - **skewed** when a majority of the voters disagree with it: it is the
//!   odd one out, and must not lead, stamp time or report ready;
//! - **unknown** otherwise (too few measurements, or a split): it may not
//!   stamp time, but nothing says it is wrong, so it stays ready — unless
//!   it was last found skewed: it stays skewed until a majority agrees with
//!   it again ([`sustain_skew`]), so a correct peer going quiet does not
//!   let the wrong clock lead.
//!
//! A node whose clock is right never becomes skewed because another node's
//! is wrong: the wrong node disagrees with it, but the others (a majority,
//! when at most a minority is wrong) agree.

/// One peer's clock as this node measured it, corrected to now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerOffset {
    /// The peer's node id.
    pub node: u64,
    /// The peer's clock minus this node's, in ms.
    pub offset_ms: i64,
    /// How far the true offset may be from `offset_ms` (half the round
    /// trip of the measurement), in ms.
    pub uncertainty_ms: u64,
}

/// The verdict on this node's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClockVerdict {
    /// A majority of the voters agree within the bound.
    Agreed {
        /// Voters that agree, this node included.
        agreeing: usize,
        /// Voters in all.
        voters: usize,
    },
    /// A majority of the voters are beyond the bound: this node's clock is
    /// the wrong one.
    Skewed {
        /// The peers that disagree, with their offsets.
        disagreeing: Vec<(u64, i64)>,
        /// Voters in all.
        voters: usize,
    },
    /// Neither: not enough measurements to say.
    Unknown {
        /// Voters that agree, this node included.
        agreeing: usize,
        /// Voters that disagree.
        disagreeing: usize,
        /// Voters in all.
        voters: usize,
    },
}

impl ClockVerdict {
    /// Whether this node may stamp time (lead): only on an agreed clock.
    pub fn may_stamp(&self) -> bool {
        matches!(self, ClockVerdict::Agreed { .. })
    }

    /// Whether this node must stand aside (not ready, not leading).
    pub fn is_skewed(&self) -> bool {
        matches!(self, ClockVerdict::Skewed { .. })
    }
}

/// How a measured offset compares with the bound.
fn compare(offset: &PeerOffset, bound_ms: u64) -> Option<bool> {
    let magnitude = offset.offset_ms.unsigned_abs();
    if magnitude.saturating_add(offset.uncertainty_ms) <= bound_ms {
        Some(true)
    } else if magnitude.saturating_sub(offset.uncertainty_ms) > bound_ms {
        Some(false)
    } else {
        None
    }
}

/// Judges node `me`'s clock against the `voters` (ids, `me` among them or
/// not) from `offsets` (fresh measurements of other nodes; others are
/// ignored) and the bound `bound_ms`.
pub fn judge_clock(me: u64, voters: &[u64], offsets: &[PeerOffset], bound_ms: u64) -> ClockVerdict {
    let mut voter_ids: Vec<u64> = voters.to_vec();
    voter_ids.sort_unstable();
    voter_ids.dedup();
    let total = voter_ids.len();
    let majority = total / 2 + 1;
    let mut agreeing = usize::from(voter_ids.contains(&me));
    let mut disagreeing = Vec::new();
    for voter in voter_ids.iter().filter(|id| **id != me) {
        match offsets
            .iter()
            .find(|o| o.node == *voter)
            .and_then(|o| compare(o, bound_ms).map(|c| (o, c)))
        {
            Some((_, true)) => agreeing += 1,
            Some((offset, false)) => disagreeing.push((offset.node, offset.offset_ms)),
            None => {}
        }
    }
    if total == 0 {
        return ClockVerdict::Unknown { agreeing, disagreeing: disagreeing.len(), voters: total };
    }
    if agreeing >= majority {
        ClockVerdict::Agreed { agreeing, voters: total }
    } else if disagreeing.len() >= majority {
        ClockVerdict::Skewed { disagreeing, voters: total }
    } else {
        ClockVerdict::Unknown { agreeing, disagreeing: disagreeing.len(), voters: total }
    }
}

/// The verdict to act on, from the one judged now and the skew this node
/// was last found in (`last_skew`: the latest [`ClockVerdict::Skewed`],
/// unless an agreed verdict came after it). A node found skewed stays
/// skewed until a majority agrees with it again: a correct peer going
/// quiet (paused, restarted, cut off) leaves only an unknown verdict, which
/// is no evidence that this clock came right — without this the wrong node
/// would stand for election, and win with its fast timer, the moment one
/// correct peer paused, and then lead a cluster it cannot stamp time for.
pub fn sustain_skew(judged: ClockVerdict, last_skew: Option<&ClockVerdict>) -> ClockVerdict {
    match (&judged, last_skew) {
        (ClockVerdict::Unknown { .. }, Some(skew @ ClockVerdict::Skewed { .. })) => skew.clone(),
        _ => judged,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(node: u64, offset_ms: i64) -> PeerOffset {
        PeerOffset { node, offset_ms, uncertainty_ms: 5 }
    }

    #[test]
    fn the_wrong_clock_is_skewed_and_the_right_ones_agree() {
        let voters = [1, 2, 3];
        // Node 3 runs two minutes ahead: 1 and 2 see it +120 s, it sees them -120 s.
        let from_three = [peer(1, -120_000), peer(2, -120_000)];
        assert!(judge_clock(3, &voters, &from_three, 500).is_skewed());
        let from_one = [peer(2, 10), peer(3, 120_000)];
        assert_eq!(
            judge_clock(1, &voters, &from_one, 500),
            ClockVerdict::Agreed { agreeing: 2, voters: 3 },
            "a healthy node is not made wrong by a wrong peer"
        );
        assert!(judge_clock(2, &voters, &[peer(1, -10), peer(3, 120_000)], 500).may_stamp());
    }

    #[test]
    fn within_the_bound_is_agreed_and_uncertainty_counts_against_it() {
        let voters = [1, 2, 3];
        assert!(judge_clock(1, &voters, &[peer(2, 400), peer(3, -300)], 500).may_stamp());
        // 498 ms apart, measured to within 5 ms: could be 503, so it says nothing.
        let unsure = [PeerOffset { node: 2, offset_ms: 498, uncertainty_ms: 5 }];
        assert!(matches!(
            judge_clock(1, &voters, &unsure, 500),
            ClockVerdict::Unknown { agreeing: 1, disagreeing: 0, voters: 3 }
        ));
        // 600 ms with a 200 ms uncertainty could be 400: not proof of skew.
        let blurred = [
            PeerOffset { node: 2, offset_ms: 600, uncertainty_ms: 200 },
            PeerOffset { node: 3, offset_ms: 600, uncertainty_ms: 200 },
        ];
        assert!(!judge_clock(1, &voters, &blurred, 500).is_skewed());
    }

    #[test]
    fn too_few_measurements_say_nothing_and_one_voter_agrees_with_itself() {
        let voters = [1, 2, 3];
        assert!(matches!(judge_clock(1, &voters, &[], 500), ClockVerdict::Unknown { .. }));
        assert!(!judge_clock(1, &voters, &[peer(2, 9_000)], 500).is_skewed(), "one of three");
        assert!(judge_clock(1, &[1], &[], 500).may_stamp());
        assert!(judge_clock(1, &[], &[], 500) != ClockVerdict::Agreed { agreeing: 0, voters: 0 });
        // A learner (not a voter) needs a majority of the voters without itself.
        assert!(judge_clock(4, &voters, &[peer(1, 0), peer(2, 0)], 500).may_stamp());
        assert!(!judge_clock(4, &voters, &[peer(1, 0)], 500).may_stamp());
        // Offsets of nodes that are not voters are ignored.
        assert!(!judge_clock(1, &[1, 2, 3], &[peer(7, 0), peer(8, 0)], 500).may_stamp());
    }

    #[test]
    fn a_skewed_clock_stays_skewed_until_a_majority_agrees_again() {
        let voters = [1, 2, 3];
        let skewed = judge_clock(3, &voters, &[peer(1, -120_000), peer(2, -120_000)], 500);
        assert!(skewed.is_skewed());
        // Node 1 pauses: only node 2 is measured, and the judged verdict
        // alone would let node 3 stand for election.
        let one_quiet = judge_clock(3, &voters, &[peer(2, -120_000)], 500);
        assert!(matches!(one_quiet, ClockVerdict::Unknown { .. }));
        assert_eq!(sustain_skew(one_quiet.clone(), Some(&skewed)), skewed);
        // A node never found skewed keeps the unknown verdict (it may not
        // stamp, but nothing says it is wrong).
        assert_eq!(
            sustain_skew(one_quiet, None),
            judge_clock(3, &voters, &[peer(2, -120_000)], 500)
        );
        // Put right: a majority agrees, whatever came before.
        let agreed = judge_clock(3, &voters, &[peer(1, 5), peer(2, -5)], 500);
        assert_eq!(sustain_skew(agreed.clone(), Some(&skewed)), agreed);
        let skewed_again = judge_clock(3, &voters, &[peer(1, 900), peer(2, 900)], 500);
        assert_eq!(sustain_skew(skewed_again.clone(), Some(&skewed)), skewed_again);
    }
}
