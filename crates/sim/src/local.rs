//! A simulated node's local, unreplicated tables — the bus table and the
//! kept peer adverts — in memory, behind the replica runtime's store traits
//! ([`BusStore`], [`AdvertStore`]), so the real bus and gate run on them;
//! and a bus table with a planted bug ([`ReleaseBothPaths`]).
//!
//! Clones share one table. Who makes them decides what a restart keeps: a
//! caller that hands a host's restarted life the same tables models a disk
//! that kept every write; one that makes new tables per life (as the sim
//! tests do) models losing them all. (The node's own tables are not synced
//! per write; losing some costs a bus key claimable again, or a peer
//! counted as never heard from until it adverts, as
//! `leasehold_storage::local` says.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use leasehold_core::Command;
use leasehold_core::bus::BusRecord;
use leasehold_replica::Journal;
use leasehold_replica::stores::{AdvertStore, BusStore, KeptAdvert, StoreError};

/// One host's bus table, in memory. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct SimBusTable(Arc<Mutex<BTreeMap<String, BusRecord>>>);

impl SimBusTable {
    fn records(&self) -> MutexGuard<'_, BTreeMap<String, BusRecord>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BusStore for SimBusTable {
    fn get(&self, key: &str) -> Result<BusRecord, StoreError> {
        Ok(self.records().get(key).cloned().unwrap_or_default())
    }

    fn update(&self, key: &str, change: &dyn Fn(&mut BusRecord)) -> Result<BusRecord, StoreError> {
        // Under the table's lock: atomic against other changes of the key.
        let mut records = self.records();
        let record = records.entry(key.to_string()).or_default();
        change(record);
        Ok(record.clone())
    }

    fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let records = self.records();
        Ok(records.keys().filter(|key| key.starts_with(prefix)).cloned().collect())
    }

    fn records(&self) -> Result<Vec<(String, BusRecord)>, StoreError> {
        Ok(SimBusTable::records(self).iter().map(|(k, r)| (k.clone(), r.clone())).collect())
    }

    fn retain(&self, keep: &dyn Fn(&BusRecord) -> bool) -> Result<usize, StoreError> {
        let mut records = SimBusTable::records(self);
        let before = records.len();
        records.retain(|_, record| keep(record));
        Ok(before - records.len())
    }
}

/// A planted bug: a host's bus table whose release also releases the
/// journal lease its executor holds on the job with the same key — a
/// release that "calls both stores", as SPEC §4 once had it, so a bus tick
/// that lost the tick to the journal hands the journal's run of it to a
/// second claimant while it is still going (docs/safety.md, "5 and 6").
/// The shipped bus tick releases only its bus claim; this wrapper puts the
/// other release back where the node's bus release lands: the moment this
/// host marks a key it won as released.
#[derive(Clone)]
pub struct ReleaseBothPaths {
    table: SimBusTable,
    node: u64,
    journal: Journal,
}

impl ReleaseBothPaths {
    /// `node`'s bus table that releases, with each bus key it won, the
    /// lease `node`'s executor (worker `node-ID`) holds on that key's job
    /// in `journal`.
    pub fn new(node: u64, journal: Journal) -> ReleaseBothPaths {
        ReleaseBothPaths { table: SimBusTable::default(), node, journal }
    }

    fn release_journal_lease(&self, key: &str) {
        let holder = format!("node-{}", self.node);
        let held = self.journal.read_stale(|state| state.leases_held_by(&holder, Some(key)));
        for (job_id, token) in held {
            let journal = self.journal.clone();
            tracing::info!(
                job = job_id,
                token,
                key,
                "planted: the bus release releases a journal lease"
            );
            tokio::spawn(async move { journal.propose(Command::Release { job_id, token }).await });
        }
    }
}

impl std::fmt::Debug for ReleaseBothPaths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReleaseBothPaths").field("node", &self.node).finish_non_exhaustive()
    }
}

impl BusStore for ReleaseBothPaths {
    fn get(&self, key: &str) -> Result<BusRecord, StoreError> {
        self.table.get(key)
    }

    fn update(&self, key: &str, change: &dyn Fn(&mut BusRecord)) -> Result<BusRecord, StoreError> {
        let before = self.table.get(key)?;
        let after = self.table.update(key, change)?;
        if !before.released && after.released && after.winner() == Some(self.node) {
            self.release_journal_lease(key);
        }
        Ok(after)
    }

    fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.table.keys_with_prefix(prefix)
    }

    fn records(&self) -> Result<Vec<(String, BusRecord)>, StoreError> {
        BusStore::records(&self.table)
    }

    fn retain(&self, keep: &dyn Fn(&BusRecord) -> bool) -> Result<usize, StoreError> {
        self.table.retain(keep)
    }
}

/// One host's kept peer adverts, in memory. Clones share them.
#[derive(Clone, Debug, Default)]
pub struct SimPeerStore(Arc<Mutex<BTreeMap<u64, KeptAdvert>>>);

impl AdvertStore for SimPeerStore {
    fn keep(&self, advert: &KeptAdvert) -> Result<(), StoreError> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.insert(advert.node, advert.clone());
        Ok(())
    }

    fn kept(&self) -> Result<(Vec<KeptAdvert>, usize), StoreError> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        Ok((kept.values().cloned().collect(), 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bus_table_keeps_changes_lists_by_prefix_and_prunes() -> Result<(), StoreError> {
        let table = SimBusTable::default();
        assert_eq!(table.get("cron:a:1")?, BusRecord::default(), "nothing held yet");
        let stored = table.update("cron:a:1", &|record| {
            record.claims.push((5, 2));
            record.touched_ms = 10;
        })?;
        assert_eq!(stored.claims, vec![(5, 2)]);
        table.update("cron:b:1", &|record| record.touched_ms = 30)?;
        assert_eq!(table.get("cron:a:1")?, stored, "an update is read back");
        assert_eq!(table.keys_with_prefix("cron:a:")?, vec!["cron:a:1".to_string()]);
        assert_eq!(table.retain(&|record| record.touched_ms >= 20)?, 1);
        assert_eq!(BusStore::records(&table)?.len(), 1, "the untouched record went");
        Ok(())
    }

    #[test]
    fn the_peer_store_keeps_the_latest_advert_per_node() -> Result<(), StoreError> {
        let store = SimPeerStore::default();
        let advert = |node, received_ms| KeptAdvert { node, received_ms, body: vec![1, 2] };
        store.keep(&advert(3, 10))?;
        store.keep(&advert(2, 11))?;
        store.keep(&advert(3, 12))?;
        let (kept, skipped) = store.kept()?;
        assert_eq!(skipped, 0);
        assert_eq!(kept, vec![advert(2, 11), advert(3, 12)], "in node order, the latest each");
        Ok(())
    }
}
