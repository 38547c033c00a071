//! The on-disk layout: what one leasehold data directory holds, the keys
//! inside its sled trees, and how keys are spelled. Kept in one place so the
//! stores, the tests and an operator poking at a data directory agree.
//!
//! | where | what |
//! | --- | --- |
//! | [`RAFT_LOG_DIR`]`/` | the Raft log: raft-log's chunk files `r-<offset>.wal` and its `LOCK`; entries, vote, committed and purged log ids as records of one stream, each bincode behind its length and the length's complement, inside a CRC32-checked record (see `wal`) |
//! | [`SNAPSHOT_FILE`] | the current snapshot (magic `LHSNAP02`, the meta's length as a little-endian `u64`, a CRC-32 of everything after the header as a little-endian `u32`, bincode `SnapshotMeta`, then the snapshot bytes; files of magic `LHSNAP01`, without the CRC, are still read) |
//! | `snapshot.receiving.N` | a snapshot's body being received from the leader, chunk by chunk; removed once installed or given up, and at start |
//! | `snapshot.tmp` | a snapshot being written (built, or copied in from a receive) before it is renamed over [`SNAPSHOT_FILE`]; removed if the write fails, and at start |
//! | `db`, `conf`, `blobs/`, `snap.*` | sled's own files: the trees below |
//!
//! | sled tree | key | value |
//! | --- | --- | --- |
//! | [`BUS_TREE`] | a bus claim key, e.g. `cron:NAME:BUCKET` | bincode `BusRecord` (local, unreplicated) |
//! | [`PEERS_TREE`] | a peer's node id, big-endian `u64` | bincode `(received wall ms, advert bytes)` (local) |
//! | [`LOG_TREE`] | log index, big-endian `u64` | bincode `Entry<TypeConfig>`: versions before the raft log; read once to migrate, then emptied |
//! | [`META_TREE`] | [`VOTE_KEY`], [`COMMITTED_KEY`], [`LAST_PURGED_KEY`] | bincode `Vote` / `LogId`: as [`LOG_TREE`] |
//! | [`SNAPSHOT_TREE`] | [`SNAPSHOT_META_KEY`], [`SNAPSHOT_DATA_KEY`] | bincode `SnapshotMeta` / snapshot bytes (data directories from before the snapshot file; read until a file replaces them) |
//! | [`PROBE_TREE`] | [`PROBE_KEY`] | versions before the raft log: the last probe's nonce (no longer written) |
//! | [`LOG_ISSUED_TREE`] | [`LOG_ISSUED_KEY`] | an empty value, written once this directory's raft log is created (or found): an open that then finds no log refuses rather than start a new one |
//!
//! Old log keys are big-endian so sled's byte order is index order: a range
//! scan walks the log forwards, which is the order the migration copies it.

/// The Raft log's directory inside the data directory (raft-log's files).
pub const RAFT_LOG_DIR: &str = "raft-log";
/// The readiness probe's scratch file, inside [`RAFT_LOG_DIR`] so the probe
/// writes to the log's disk; it exists only while a probe runs.
pub const PROBE_FILE: &str = "probe";

/// Where versions before the raft log kept its entries, keyed by
/// [`log_key`]; migrated on open, then emptied.
pub const LOG_TREE: &str = "logs";
/// Where versions before the raft log kept Raft's small durable facts:
/// vote, committed log id, last purged log id; migrated with [`LOG_TREE`].
pub const META_TREE: &str = "meta";
/// Where older versions kept the one current snapshot (meta and bytes,
/// written together); now only read, until [`SNAPSHOT_FILE`] exists.
pub const SNAPSHOT_TREE: &str = "snapshot";
/// The current snapshot: a file in the data directory, beside sled's own,
/// replaced whole (temporary file, fsync, rename, directory fsync).
pub const SNAPSHOT_FILE: &str = "snapshot";
/// Where versions before the raft log wrote the readiness probe's record.
pub const PROBE_TREE: &str = "probe";

/// Where a data directory records that its raft log was created, so that
/// a log deleted later is noticed ([`LOG_ISSUED_KEY`]).
pub const LOG_ISSUED_TREE: &str = "raft_log";
/// The key of [`LOG_ISSUED_TREE`] present once the raft log exists.
pub const LOG_ISSUED_KEY: &str = "created";

/// The bus's local claim table: never replicated, never in a snapshot.
pub const BUS_TREE: &str = "bus";
/// Tree keeping each peer's last valid advert, so a restarted node still
/// counts a member that is down by its last advert.
pub const PEERS_TREE: &str = "peers";

/// Key of the last saved vote in [`META_TREE`].
pub const VOTE_KEY: &str = "vote";
/// Key of the last saved committed log id in [`META_TREE`].
pub const COMMITTED_KEY: &str = "committed";
/// Key of the last purged log id in [`META_TREE`].
pub const LAST_PURGED_KEY: &str = "last_purged";
/// Key of the current snapshot's meta in [`SNAPSHOT_TREE`].
pub const SNAPSHOT_META_KEY: &str = "meta";
/// Key of the current snapshot's bytes in [`SNAPSHOT_TREE`].
pub const SNAPSHOT_DATA_KEY: &str = "data";
/// Key of the probe record in [`PROBE_TREE`].
pub const PROBE_KEY: &str = "probe";

/// The sled key of the log entry at `index`.
pub fn log_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The log index a [`LOG_TREE`] key stands for; `None` when the key is not
/// eight bytes long (a foreign or damaged key).
pub fn log_index(key: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = key.try_into().ok()?;
    Some(u64::from_be_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_keys_sort_like_indexes_and_round_trip() {
        let indexes = [0_u64, 1, 255, 256, 65_536, u64::MAX - 1, u64::MAX];
        for pair in indexes.windows(2) {
            assert!(log_key(pair[0]) < log_key(pair[1]), "{pair:?}");
        }
        for index in indexes {
            assert_eq!(log_index(&log_key(index)), Some(index));
        }
        assert_eq!(log_index(b"short"), None);
    }
}
