//! Group commit in pure form: several proposers' commands merged into one
//! `Batch` log entry, and its `Response::Batch` split back so each proposer
//! gets its own answers. The journal decides *when* to merge; this decides
//! *how*, so the split always mirrors the merge.

use crate::command::{Command, MAX_BATCH_COMMANDS};
use crate::response::Response;

/// What one proposer's command became in a merged batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Share {
    /// A single command: one response.
    One,
    /// A (well-formed) batch of this many commands: a `Response::Batch`
    /// of theirs.
    Many(usize),
}

/// The commands `command` adds to a merged batch: one, or the commands of
/// a well-formed batch (which merges into the larger one); `None` for a
/// malformed batch (empty, too large, or nested), which must be proposed
/// alone so that it gets its own refusal.
pub fn merge_weight(command: &Command) -> Option<usize> {
    match command {
        Command::Batch { commands } => {
            let well_formed = !commands.is_empty()
                && commands.len() <= MAX_BATCH_COMMANDS
                && !commands.iter().any(|c| matches!(c, Command::Batch { .. }));
            well_formed.then_some(commands.len())
        }
        _ => Some(1),
    }
}

/// Most bytes (by [`Command::size_hint`]) in one merged log entry. A
/// command larger than this on its own is an entry of its own, so an entry
/// is at most this or one command's size: well inside what a node accepts
/// from a peer, whatever fields the commands fill.
pub const MAX_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// Most bytes (by [`Command::answer_bound`]) the answers of one merged
/// batch may take. A follower forwards its batch to the leader as one
/// message and gets the answers back as one, which a node takes up to
/// 64 MiB of; in the text layout an earlier build's leader answers in, a
/// payload's byte takes up to four. A claim's leases are granted before
/// the answer is sent, so an answer too large to send would leave them
/// held by no one until they lapse, each charging its job an attempt.
pub const MAX_BATCH_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Most leases a claim forwarded to the leader may ask for, when one
/// lease takes at most `grant_bytes`: its answer must fit in
/// [`MAX_BATCH_ANSWER_BYTES`]. At least one.
pub fn max_forwarded_leases(grant_bytes: usize) -> u32 {
    let leases = (MAX_BATCH_ANSWER_BYTES - 64) / grant_bytes.max(1);
    u32::try_from(leases).unwrap_or(u32::MAX).max(1)
}

/// What a batch being formed holds: commands, bytes, and the bytes its
/// answers may take when a lease takes at most `grant_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fill {
    commands: usize,
    bytes: usize,
    answers: usize,
    grant_bytes: usize,
}

impl Fill {
    /// A batch begun with `first`, its leases taking at most `grant_bytes`
    /// each ([`crate::Limits::grant_bytes_bound`]); `None` when `first`
    /// must be proposed alone (see [`merge_weight`]).
    pub fn start(first: &Command, grant_bytes: usize) -> Option<Fill> {
        Some(Fill {
            commands: merge_weight(first)?,
            bytes: first.size_hint(),
            answers: first.answer_bound(grant_bytes),
            grant_bytes,
        })
    }

    /// Whether nothing more may join.
    pub fn is_full(&self) -> bool {
        self.commands >= MAX_BATCH_COMMANDS
            || self.bytes >= MAX_BATCH_BYTES
            || self.answers >= MAX_BATCH_ANSWER_BYTES
    }

    /// The batch with `next` in it, or `None` when `next` must begin the
    /// next batch: it would take the batch past its commands, its bytes or
    /// its answers' bytes, or it is a malformed batch.
    pub fn admit(self, next: &Command) -> Option<Fill> {
        let commands = self.commands + merge_weight(next)?;
        let bytes = self.bytes + next.size_hint();
        let answers = self.answers.saturating_add(next.answer_bound(self.grant_bytes));
        (commands <= MAX_BATCH_COMMANDS
            && bytes <= MAX_BATCH_BYTES
            && answers <= MAX_BATCH_ANSWER_BYTES)
            .then_some(Fill { commands, bytes, answers, ..self })
    }
}

/// One `Batch` of every command, flattened, and each proposer's share of it.
pub fn merge(commands: Vec<Command>) -> (Command, Vec<Share>) {
    let mut merged = Vec::new();
    let mut shares = Vec::with_capacity(commands.len());
    for command in commands {
        match command {
            Command::Batch { commands: inner } => {
                shares.push(Share::Many(inner.len()));
                merged.extend(inner);
            }
            command => {
                shares.push(Share::One);
                merged.push(command);
            }
        }
    }
    (Command::Batch { commands: merged }, shares)
}

/// Why a batch's answer cannot be split.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// The answer is not a batch answer.
    #[error("a batch was answered {0}")]
    NotABatch(String),
    /// It answers another number of commands than were merged.
    #[error("a batch of {expected} commands was answered {got} responses")]
    Count {
        /// Commands merged.
        expected: usize,
        /// Responses answered.
        got: usize,
    },
}

/// Each proposer's answer, in the order of `shares`.
pub fn split(response: Response, shares: &[Share]) -> Result<Vec<Response>, SplitError> {
    let Response::Batch(responses) = response else {
        return Err(SplitError::NotABatch(format!("{response:?}")));
    };
    let expected: usize =
        shares.iter().map(|share| if let Share::Many(n) = share { *n } else { 1 }).sum();
    if responses.len() != expected {
        return Err(SplitError::Count { expected, got: responses.len() });
    }
    let mut responses = responses.into_iter();
    Ok(shares
        .iter()
        .map(|share| match share {
            Share::One => responses.next().unwrap_or(Response::Batch(Vec::new())),
            Share::Many(n) => Response::Batch(responses.by_ref().take(*n).collect()),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep() -> Command {
        Command::Sweep
    }

    /// A lease's bound under the default limits.
    const GRANT: usize = 275_000;

    /// A claim of up to `max` leases.
    fn claim(max: u32) -> Command {
        Command::Claim {
            worker: "w".into(),
            queue: "q".into(),
            max,
            lease_ttl_ms: None,
            selector: Vec::new(),
        }
    }

    #[test]
    fn the_default_bound_of_a_lease_is_what_the_tests_use() {
        let bound = crate::Limits::default().grant_bytes_bound();
        assert!(bound > 256 * 1024 && bound.abs_diff(GRANT) < 10_000, "{bound}");
    }

    #[test]
    fn claims_merge_only_while_their_answers_would_fit_in_one_message() {
        // One-lease claims of 256 KiB jobs: far fewer than 256 per batch.
        let mut fill = Fill::start(&claim(1), GRANT).expect("a command");
        let mut merged = 1;
        while let Some(more) = fill.admit(&claim(1)) {
            fill = more;
            merged += 1;
        }
        assert_eq!(merged, MAX_BATCH_ANSWER_BYTES / (GRANT + 64), "{merged}");
        assert!(merged * GRANT <= MAX_BATCH_ANSWER_BYTES);
        assert!(merged > 32, "32 one-lease claims still share a batch: {merged}");
        // A claim whose leases alone could fill the answer begins its own.
        let fill = Fill::start(&Command::Sweep, GRANT).expect("a command");
        assert_eq!(fill.admit(&claim(1_000)), None);
        // The most a forwarded claim may ask for fits, one more does not.
        let most = max_forwarded_leases(GRANT);
        assert!(claim(most).answer_bound(GRANT) <= MAX_BATCH_ANSWER_BYTES);
        assert!(claim(most + 1).answer_bound(GRANT) > MAX_BATCH_ANSWER_BYTES);
        assert_eq!(max_forwarded_leases(usize::MAX), 1, "at least one lease");
    }

    #[test]
    fn a_forwarded_batch_caps_every_claim_in_it_and_nothing_else() {
        let once = |max| Command::ClaimOnce {
            request_id: "r".into(),
            worker: "w".into(),
            queue: "q".into(),
            max,
            lease_ttl_ms: None,
            selector: Vec::new(),
        };
        let batch = Command::Batch { commands: vec![claim(1_000), once(7), sweep(), once(500)] };
        let ruled = Command::Ruled { limits: crate::Limits::default(), command: Box::new(batch) };
        let capped = ruled.with_claims_capped(60);
        let Command::Ruled { command, .. } = capped else { panic!("still ruled") };
        let expected = Command::Batch { commands: vec![claim(60), once(7), sweep(), once(60)] };
        assert_eq!(*command, expected);
    }

    /// An enqueue of `jobs` jobs whose bytes are all in tags, not payloads.
    fn tagged_enqueue(jobs: usize) -> Command {
        let job = crate::job::JobSpec {
            queue: "q".into(),
            tags: (0..32).map(|_| "t".repeat(256)).collect(),
            ..Default::default()
        };
        Command::Enqueue { jobs: vec![job; jobs] }
    }

    #[test]
    fn a_batch_is_bounded_by_every_byte_not_only_payloads() {
        // About 8.4 MiB of tags and no payload: an entry of its own.
        let heavy = tagged_enqueue(1_000);
        let fill = Fill::start(&Command::Sweep, GRANT).expect("a command");
        assert_eq!(fill.admit(&heavy), None, "joins no batch");
        let alone = Fill::start(&heavy, GRANT).expect("begins one");
        assert!(alone.is_full());
        // Long nack errors weigh as much.
        let nack = |len: usize| Command::Nack {
            job_id: 1,
            token: 1,
            error: "e".repeat(len),
            retry_after_ms: None,
        };
        let mut fill = Fill::start(&nack(1 << 20), GRANT).expect("a command");
        let mut merged = 1;
        while let Some(more) = fill.admit(&nack(1 << 20)) {
            fill = more;
            merged += 1;
        }
        assert_eq!(
            merged, 3,
            "three 1 MiB nacks and their framing fit in 4 MiB, a fourth does not"
        );
        // Small commands still fill a batch to its count.
        let mut fill = Fill::start(&tagged_enqueue(1), GRANT).expect("a command");
        let mut merged = 1;
        while let Some(more) = fill.admit(&tagged_enqueue(1)) {
            fill = more;
            merged += 1;
        }
        assert_eq!(merged, MAX_BATCH_COMMANDS);
        assert!(fill.is_full());
    }

    #[test]
    fn a_merge_splits_back_to_each_proposers_answers() -> Result<(), SplitError> {
        let commands = vec![
            sweep(),
            Command::Batch { commands: vec![Command::Purge, sweep(), Command::Purge] },
            sweep(),
        ];
        let (merged, shares) = merge(commands);
        assert_eq!(shares, vec![Share::One, Share::Many(3), Share::One]);
        let Command::Batch { commands } = &merged else { panic!("a batch") };
        assert_eq!(commands.len(), 5);
        let answers: Vec<Response> = (0..5).map(Response::Redriven).collect();
        let split = split(Response::Batch(answers), &shares)?;
        assert_eq!(
            split,
            vec![
                Response::Redriven(0),
                Response::Batch(vec![
                    Response::Redriven(1),
                    Response::Redriven(2),
                    Response::Redriven(3)
                ]),
                Response::Redriven(4),
            ]
        );
        Ok(())
    }

    #[test]
    fn an_answer_of_the_wrong_shape_is_an_error_not_a_guess() {
        let shares = [Share::One, Share::Many(2)];
        let short = Response::Batch(vec![Response::Acked, Response::Acked]);
        assert_eq!(split(short, &shares), Err(SplitError::Count { expected: 3, got: 2 }));
        assert!(matches!(split(Response::Acked, &shares), Err(SplitError::NotABatch(_))));
    }

    #[test]
    fn only_well_formed_batches_merge() {
        assert_eq!(merge_weight(&sweep()), Some(1));
        assert_eq!(merge_weight(&Command::Batch { commands: vec![sweep(), sweep()] }), Some(2));
        assert_eq!(merge_weight(&Command::Batch { commands: vec![] }), None);
        let nested = Command::Batch { commands: vec![Command::Batch { commands: vec![sweep()] }] };
        assert_eq!(merge_weight(&nested), None);
        let huge = Command::Batch { commands: vec![sweep(); MAX_BATCH_COMMANDS + 1] };
        assert_eq!(merge_weight(&huge), None);
    }
}
