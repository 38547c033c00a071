//! A node's local, unreplicated stores, beside the Raft trees in the same
//! database and through the same codec: the bus table (one
//! [`BusRecord`] per claimed key) and the peer adverts kept across
//! restarts. Neither is in a snapshot; losing them costs what the gate's
//! docs say (a bus key claimable again, a peer counted as never heard from
//! until it adverts), never replicated state.

use leasehold_core::bus::BusRecord;

use crate::StorageError;
use crate::codec::{decode, encode};
use crate::layout::{BUS_TREE, PEERS_TREE};

/// The bus table: bus claim key → [`BusRecord`].
#[derive(Clone, Debug)]
pub struct BusTable {
    tree: sled::Tree,
}

impl BusTable {
    pub(crate) fn open(db: &sled::Db) -> Result<BusTable, StorageError> {
        Ok(BusTable { tree: db.open_tree(BUS_TREE)? })
    }

    /// The record of `key` (an empty one when none is held).
    pub fn get(&self, key: &str) -> Result<BusRecord, StorageError> {
        match self.tree.get(key.as_bytes())? {
            Some(bytes) => decode(BUS_TREE, key, &bytes),
            None => Ok(BusRecord::default()),
        }
    }

    /// Changes the record of `key` with `change` and stores it, atomically
    /// against concurrent changes of the same key (compare and swap, retried);
    /// answers the record stored.
    pub fn update(
        &self,
        key: &str,
        change: impl Fn(&mut BusRecord),
    ) -> Result<BusRecord, StorageError> {
        loop {
            let old = self.tree.get(key.as_bytes())?;
            let mut record = match &old {
                Some(bytes) => decode(BUS_TREE, key, bytes)?,
                None => BusRecord::default(),
            };
            change(&mut record);
            let new = encode("bus record", &record)?;
            if self.tree.compare_and_swap(key.as_bytes(), old, Some(new))?.is_ok() {
                return Ok(record);
            }
        }
    }

    /// The keys that start with `prefix`, in byte order.
    pub fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let mut keys = Vec::new();
        for entry in self.tree.scan_prefix(prefix.as_bytes()) {
            let (key, _) = entry?;
            keys.push(String::from_utf8_lossy(&key).into_owned());
        }
        Ok(keys)
    }

    /// Every record, by key.
    pub fn records(&self) -> Result<Vec<(String, BusRecord)>, StorageError> {
        let mut records = Vec::new();
        for entry in self.tree.iter() {
            let (key, value) = entry?;
            let key = String::from_utf8_lossy(&key).into_owned();
            let record = decode(BUS_TREE, &key, &value)?;
            records.push((key, record));
        }
        Ok(records)
    }

    /// Drops every record `keep` says no to, and every record that does not
    /// decode (it is only a local cache of claims long decided, perhaps
    /// written by another version); answers how many went.
    pub fn retain(&self, keep: impl Fn(&BusRecord) -> bool) -> Result<usize, StorageError> {
        let mut dropped = 0;
        for entry in self.tree.iter() {
            let (key, value) = entry?;
            let kept = decode::<BusRecord>(BUS_TREE, "", &value).is_ok_and(|r| keep(&r));
            if !kept {
                self.tree.remove(key)?;
                dropped += 1;
            }
        }
        Ok(dropped)
    }
}

/// One peer's last valid advert as kept on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptAdvert {
    /// The peer's node id.
    pub node: u64,
    /// When this node accepted it (its wall clock, Unix ms).
    pub received_ms: u64,
    /// The advert's encoded body, as it was signed.
    pub body: Vec<u8>,
}

/// The kept adverts: node id (big-endian, so ids sort) → when and what.
#[derive(Clone, Debug)]
pub struct PeerStore {
    tree: sled::Tree,
}

impl PeerStore {
    pub(crate) fn open(db: &sled::Db) -> Result<PeerStore, StorageError> {
        Ok(PeerStore { tree: db.open_tree(PEERS_TREE)? })
    }

    /// Keeps `advert` as node `node`'s latest, replacing the one before.
    /// Not flushed on its own: a lost write only makes a restart forget the
    /// peer until its next advert.
    pub fn keep(&self, advert: &KeptAdvert) -> Result<(), StorageError> {
        let value = encode("kept advert", &(advert.received_ms, &advert.body))?;
        self.tree.insert(advert.node.to_be_bytes(), value)?;
        Ok(())
    }

    /// Every kept advert that decodes, in node order; one that does not
    /// (written by an older layout, or damaged) is left out and reported by
    /// `skipped`.
    pub fn kept(&self) -> Result<(Vec<KeptAdvert>, usize), StorageError> {
        let mut kept = Vec::new();
        let mut skipped = 0;
        for entry in self.tree.iter() {
            let (key, value) = entry?;
            let Ok(id) = <[u8; 8]>::try_from(key.as_ref()) else {
                skipped += 1;
                continue;
            };
            let node = u64::from_be_bytes(id);
            match decode::<(u64, Vec<u8>)>(PEERS_TREE, node, &value) {
                Ok((received_ms, body)) => kept.push(KeptAdvert { node, received_ms, body }),
                Err(_) => skipped += 1,
            }
        }
        Ok((kept, skipped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Result<sled::Db, StorageError> {
        Ok(sled::Config::new().temporary(true).open()?)
    }

    #[test]
    fn bus_records_round_trip_update_and_prune() -> Result<(), StorageError> {
        let db = db()?;
        let table = BusTable::open(&db)?;
        assert_eq!(table.get("cron:a:1")?, BusRecord::default());
        table.update("cron:a:1", |r| r.add(5, 2))?;
        let record = table.update("cron:a:1", |r| r.add(4, 3))?;
        assert_eq!(record.claims, vec![(4, 3), (5, 2)]);
        assert_eq!(table.get("cron:a:1")?, record);
        table.update("cron:a:2", |r| r.touched_ms = 99)?;
        table.update("cron:b:1", |r| r.touched_ms = 1)?;
        assert_eq!(table.keys_with_prefix("cron:a:")?, vec!["cron:a:1", "cron:a:2"]);
        db.open_tree(BUS_TREE)?.insert("cron:junk", b"{not bincode".to_vec())?;
        assert!(table.get("cron:junk").is_err(), "a damaged record is an error, not a default");
        assert_eq!(table.retain(|r| r.touched_ms >= 50)?, 3, "old, then undecodable, dropped");
        assert_eq!(table.records()?.len(), 1);
        Ok(())
    }

    #[test]
    fn kept_adverts_round_trip_and_skip_what_does_not_decode() -> Result<(), StorageError> {
        let db = db()?;
        let store = PeerStore::open(&db)?;
        let two = KeptAdvert { node: 2, received_ms: 1_000, body: vec![1, 2, 3] };
        store.keep(&two)?;
        store.keep(&KeptAdvert { node: 2, received_ms: 2_000, body: vec![4] })?;
        store.keep(&KeptAdvert { node: 3, received_ms: 7, body: vec![] })?;
        // The layout before this store: wall ms then the body, raw.
        db.open_tree(PEERS_TREE)?.insert(9u64.to_be_bytes(), vec![0, 0, 0, 0, 0, 0, 0, 1, 42])?;
        let (kept, skipped) = store.kept()?;
        assert_eq!(skipped, 1);
        assert_eq!(
            kept,
            vec![
                KeptAdvert { node: 2, received_ms: 2_000, body: vec![4] },
                KeptAdvert { node: 3, received_ms: 7, body: vec![] },
            ]
        );
        Ok(())
    }
}
