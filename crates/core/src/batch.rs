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

/// What a batch being formed holds: commands and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fill {
    commands: usize,
    bytes: usize,
}

impl Fill {
    /// A batch begun with `first`; `None` when `first` must be proposed
    /// alone (see [`merge_weight`]).
    pub fn start(first: &Command) -> Option<Fill> {
        Some(Fill { commands: merge_weight(first)?, bytes: first.size_hint() })
    }

    /// Whether nothing more may join.
    pub fn is_full(&self) -> bool {
        self.commands >= MAX_BATCH_COMMANDS || self.bytes >= MAX_BATCH_BYTES
    }

    /// The batch with `next` in it, or `None` when `next` must begin the
    /// next batch: it would take the batch past its commands or its bytes,
    /// or it is a malformed batch.
    pub fn admit(self, next: &Command) -> Option<Fill> {
        let commands = self.commands + merge_weight(next)?;
        let bytes = self.bytes + next.size_hint();
        (commands <= MAX_BATCH_COMMANDS && bytes <= MAX_BATCH_BYTES)
            .then_some(Fill { commands, bytes })
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
        let fill = Fill::start(&Command::Sweep).expect("a command");
        assert_eq!(fill.admit(&heavy), None, "joins no batch");
        let alone = Fill::start(&heavy).expect("begins one");
        assert!(alone.is_full());
        // Long nack errors weigh as much.
        let nack = |len: usize| Command::Nack {
            job_id: 1,
            token: 1,
            error: "e".repeat(len),
            retry_after_ms: None,
        };
        let mut fill = Fill::start(&nack(1 << 20)).expect("a command");
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
        let mut fill = Fill::start(&tagged_enqueue(1)).expect("a command");
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
