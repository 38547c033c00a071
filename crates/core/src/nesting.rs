//! A bound on how deeply commands and responses nest when they are read.
//!
//! `Command::Batch`, `Command::Ruled`, `Command::Planned` and
//! `Response::Batch` hold values of their own type, and the binary decoder
//! follows such nesting as deep as the bytes say: a few megabytes of
//! batches each holding one batch would overflow the reading thread's
//! stack and abort the whole process, which no error handling can catch.
//! The layouts in use nest three deep at most (a ruled batch of commands,
//! one of them a planned tick); reading refuses more than [`MAX_NESTING`].
//! The bound is kept per thread: a value is read on one thread, start to
//! end.

use std::cell::Cell;

use serde::{Deserialize, Deserializer};

/// How deeply a command or a response may nest in what is read.
pub const MAX_NESTING: u32 = 8;

thread_local! {
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// One level of nesting, left when dropped (on an error too).
struct Level;

impl Level {
    fn enter<E: serde::de::Error>() -> Result<Level, E> {
        let depth = DEPTH.with(Cell::get);
        if depth >= MAX_NESTING {
            return Err(E::custom(format!("nested more than {MAX_NESTING} deep")));
        }
        DEPTH.with(|cell| cell.set(depth + 1));
        Ok(Level)
    }
}

impl Drop for Level {
    fn drop(&mut self) {
        DEPTH.with(|cell| cell.set(cell.get().saturating_sub(1)));
    }
}

/// Reads a value that may hold values of its own kind (a list of them, or
/// one boxed), one level deeper.
pub(crate) fn nested<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let _level = Level::enter::<D::Error>()?;
    T::deserialize(deserializer)
}

#[cfg(test)]
mod tests {
    use crate::command::Command;
    use crate::response::Response;

    /// A batch holding a batch, `depth` times over, in the binary layout
    /// nodes send (bincode, fixed-width integers), made byte by byte so
    /// that making it takes no stack. (The envelope's tests read a million
    /// levels on a small stack.)
    fn nested_batches(depth: usize) -> Vec<u8> {
        let one = Command::Batch { commands: vec![Command::Sweep] };
        let bytes = bincode::serialize(&one).unwrap_or_default();
        // The batch's variant and its list's length, then the sweep.
        let (opening, sweep) = bytes.split_at(12);
        let mut nested = opening.repeat(depth);
        nested.extend_from_slice(sweep);
        nested
    }

    #[test]
    fn what_nodes_write_reads_back() -> Result<(), bincode::Error> {
        let ruled = Command::Ruled {
            limits: crate::Limits::default(),
            command: Box::new(Command::Batch { commands: vec![Command::Sweep, Command::Purge] }),
        };
        let read: Command = bincode::deserialize(&bincode::serialize(&ruled)?)?;
        assert_eq!(read, ruled);
        let answers = Response::Batch(vec![Response::Redriven(1), Response::Redriven(2)]);
        let read: Response = bincode::deserialize(&bincode::serialize(&answers)?)?;
        assert_eq!(read, answers);
        let deepest: Command = bincode::deserialize(&nested_batches(super::MAX_NESTING as usize))?;
        assert!(matches!(deepest, Command::Batch { .. }));
        Ok(())
    }

    #[test]
    fn one_level_more_is_refused_and_the_next_read_is_not() {
        let too_deep = bincode::deserialize::<Command>(&nested_batches(9));
        let error = too_deep.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("nested more than 8"), "{error}");
        // The count is left as it was found.
        assert!(bincode::deserialize::<Command>(&nested_batches(8)).is_ok());
    }
}
