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
