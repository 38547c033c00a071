//! Value encoding: bincode with fixed-width integers (the same bytes
//! `bincode::serialize` produces), and trailing bytes rejected on decode so a
//! record with garbage appended is reported, not half-read. Also the FNV-1a
//! digest replicas compare to check that they converged.

use std::fmt::Display;
use std::io;

use bincode::Options;
use leasehold_core::State;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::StorageError;

fn options() -> impl Options {
    bincode::DefaultOptions::new().with_fixint_encoding().reject_trailing_bytes()
}

/// Encodes `value`; `what` names it in the error.
pub(crate) fn encode<T: Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<Vec<u8>, StorageError> {
    options().serialize(value).map_err(|source| StorageError::Encode { what, source })
}

/// The length of `value`'s encoding, without encoding it; fails exactly
/// where [`encode`] would.
pub(crate) fn encoded_len<T: Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<u64, StorageError> {
    options().serialized_size(value).map_err(|source| StorageError::Encode { what, source })
}

/// Encodes `value` onto `writer` (the bytes [`encode`] would return);
/// `what` names it in the error.
pub(crate) fn encode_into<T: Serialize + ?Sized>(
    what: &'static str,
    writer: &mut impl io::Write,
    value: &T,
) -> Result<(), StorageError> {
    options().serialize_into(writer, value).map_err(|source| StorageError::Encode { what, source })
}

/// Decodes the record stored under `key` in `tree`; a failure is
/// [`StorageError::Corrupt`], never a default value.
pub(crate) fn decode<T: DeserializeOwned>(
    tree: &'static str,
    key: impl Display,
    bytes: &[u8],
) -> Result<T, StorageError> {
    options().deserialize(bytes).map_err(|source| StorageError::Corrupt {
        tree,
        key: key.to_string(),
        source,
    })
}

/// Decodes the record stored under `key` in `tree` from `reader`, which
/// holds exactly `len` bytes of it: a length inside that claims more than
/// `len` bytes is refused before anything is allocated for it, and bytes
/// left after the value are reported, as [`decode`] does for a slice. For
/// records too large to read into memory first (a snapshot body).
pub(crate) fn decode_from<T: DeserializeOwned>(
    tree: &'static str,
    key: impl Display,
    reader: &mut impl io::Read,
    len: u64,
) -> Result<T, StorageError> {
    let corrupt = |source| StorageError::Corrupt { tree, key: key.to_string(), source };
    let mut limited = io::Read::take(reader, len);
    let value = options().with_limit(len).deserialize_from(&mut limited).map_err(corrupt)?;
    let mut more = [0u8; 1];
    match io::Read::read(&mut limited, &mut more) {
        Ok(0) => Ok(value),
        Ok(_) => Err(corrupt(Box::new(bincode::ErrorKind::Custom(
            "bytes left over after the value".to_string(),
        )))),
        Err(error) => Err(corrupt(Box::new(bincode::ErrorKind::Io(error)))),
    }
}

/// FNV-1a 64 over the bincode encoding of `state`.
///
/// Two replicas that applied the same log prefix hold equal states and so
/// equal digests; the check is cheap enough to run after every test phase.
/// The state is streamed into the hash, never buffered.
pub fn digest(state: &State) -> u64 {
    let mut hasher = Fnv1a64::new();
    options()
        .serialize_into(&mut hasher, state)
        .expect("State is plain derived serde and the hasher never fails a write");
    hasher.finish()
}

/// FNV-1a, 64-bit: tiny, stable across versions and platforms, which is all a
/// convergence check needs (it is not a defence against forgery). Written
/// to as an [`io::Write`], so [`encode_into`] can stream a value into it.
pub(crate) struct Fnv1a64 {
    hash: u64,
}

impl Fnv1a64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    pub(crate) fn new() -> Self {
        Fnv1a64 { hash: Self::OFFSET_BASIS }
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.hash ^= u64::from(*byte);
            self.hash = self.hash.wrapping_mul(Self::PRIME);
        }
    }

    pub(crate) fn finish(&self) -> u64 {
        self.hash
    }
}

impl io::Write for Fnv1a64 {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.update(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_published_vectors() {
        // Vectors from the FNV reference (draft-eastlake-fnv).
        for (input, want) in [
            (&b""[..], 0xcbf2_9ce4_8422_2325_u64),
            (b"a", 0xaf63_dc4c_8601_ec8c),
            (b"foobar", 0x8594_4171_f739_67e8),
        ] {
            let mut hasher = Fnv1a64::new();
            hasher.update(input);
            assert_eq!(hasher.finish(), want, "{input:?}");
        }
    }

    #[test]
    fn encoding_matches_plain_bincode_and_rejects_trailing_bytes() {
        let value = (7_u64, String::from("q"), vec![1_u8, 2, 3]);
        let bytes = encode("tuple", &value).expect("encodes");
        assert_eq!(bytes, bincode::serialize(&value).expect("encodes"));
        let back: (u64, String, Vec<u8>) = decode("t", "k", &bytes).expect("decodes");
        assert_eq!(back, value);

        let mut padded = bytes;
        padded.push(0);
        let err = decode::<(u64, String, Vec<u8>)>("t", "k", &padded).expect_err("trailing byte");
        assert!(matches!(err, StorageError::Corrupt { tree: "t", .. }), "{err}");
    }

    #[test]
    fn digest_is_fnv_over_the_plain_bincode_of_the_state() {
        let state = State::new();
        let mut hasher = Fnv1a64::new();
        hasher.update(&bincode::serialize(&state).expect("encodes"));
        assert_eq!(digest(&state), hasher.finish());
    }
}
