//! The scheduler state as openraft's state machine on the simulated disk:
//! [`SimStateMachine`] implements [`RaftStateMachine`] and builds its own
//! snapshots.
//!
//! It follows the sled store's state machine: the live
//! [`State`](leasehold_core::State) is in memory and changes only through
//! [`leasehold_raft::apply_entry`], the node's own apply rule
//! ([`State::apply`] with the lease epoch taken from the term of the leader
//! that committed the entry); exactly one response per entry; only snapshots
//! reach the disk, synced before they are reported built or installed, and
//! a slower build never replaces a newer persisted snapshot.
//!
//! It is also the replica runtime's state machine
//! ([`leasehold_replica::ReplicaStateMachine`]): the journal's reads and
//! its applied-index waits run on it. It does not measure its snapshot
//! builds (they hold the lock throughout; the state is small).

use std::ops::Deref;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use leasehold_core::{Command, Proposal, Response, State};
use leasehold_raft::{NodeId, Received, SnapshotData, TypeConfig};
use leasehold_replica::stores::{ReplicaStateMachine, StateDigest, StateGuard, StoreError};
use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot,
    StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::SimDiskError;
use crate::bugs::Bug;
use crate::disk::{Meta, SimDisk, StoredSnapshot, Write};

/// Membership as the state machine records it.
type Membership = StoredMembership<NodeId, BasicNode>;

/// Everything apply changes, under one lock.
#[derive(Debug, Default)]
struct Applied {
    last_applied: Option<LogId<NodeId>>,
    last_membership: Membership,
    state: State,
}

/// The snapshot body: the applied position, the membership and the state.
#[derive(Serialize)]
struct BodyRef<'a> {
    last_applied: &'a Option<LogId<NodeId>>,
    last_membership: &'a Membership,
    state: &'a State,
}

#[derive(Deserialize)]
struct Body {
    last_applied: Option<LogId<NodeId>>,
    last_membership: Membership,
    state: State,
}

impl Body {
    /// Decodes `bytes` and checks they are at the position `meta` names.
    fn decode_for(meta: &Meta, bytes: &[u8]) -> Result<Body, SimDiskError> {
        let body: Body = bincode::deserialize(bytes)
            .map_err(|source| SimDiskError::Codec { what: "snapshot body", source })?;
        if body.last_applied != meta.last_log_id || body.last_membership != meta.last_membership {
            return Err(SimDiskError::Inconsistent {
                snapshot_id: meta.snapshot_id.clone(),
                detail: format!(
                    "body is at {:?} with {:?}, meta says {:?} with {:?}",
                    body.last_applied, body.last_membership, meta.last_log_id, meta.last_membership
                ),
            });
        }
        Ok(body)
    }
}

/// The simulated state machine of one life of a node. Cheap to clone;
/// clones share the state, so a node can keep one for reads.
#[derive(Clone, Debug)]
pub struct SimStateMachine {
    disk: SimDisk,
    life: u64,
    applied: Arc<RwLock<Applied>>,
    applied_index: Arc<watch::Sender<u64>>,
    /// Serializes snapshot writes, so an older one never overwrites a newer.
    snapshot_write: Arc<tokio::sync::Mutex<()>>,
}

/// The planted [`Bug::AckWithoutTokenCheck`]: an ack of a job that holds a
/// lease is given that lease's token, so the token check in apply always
/// passes — a bare ack, or one inside the leader's rules or a batch (the
/// token the job holds as the entry starts). Deterministic in the state, so
/// every replica agrees.
fn ack_with_current_token(state: &State, mut entry: Entry<TypeConfig>) -> Entry<TypeConfig> {
    if let EntryPayload::Normal(Proposal { command, .. }) = &mut entry.payload {
        give_acks_current_tokens(state, command);
    }
    entry
}

fn give_acks_current_tokens(state: &State, command: &mut Command) {
    match command {
        Command::Ack { job_id, token, .. } | Command::AckLean { job_id, token, .. } => {
            if let Some(current) = state.job(*job_id).and_then(|job| job.lease.map(|l| l.token)) {
                *token = current;
            }
        }
        Command::Ruled { command, .. } => give_acks_current_tokens(state, command),
        Command::Batch { commands } => {
            for command in commands {
                give_acks_current_tokens(state, command);
            }
        }
        _ => {}
    }
}

fn index_of(log_id: &Option<LogId<NodeId>>) -> u64 {
    log_id.as_ref().map_or(0, |log_id| log_id.index)
}

impl SimStateMachine {
    /// Loads the state from the disk's snapshot, if any (openraft then
    /// re-applies the log after it). A snapshot that does not decode was
    /// never written by this store: the state starts empty and the error is
    /// logged, as a damaged disk would surface on the next read.
    pub(crate) fn open(disk: SimDisk, life: u64) -> SimStateMachine {
        let snapshot = disk.read(life, |image| image.snapshot.clone()).ok().flatten();
        let applied = match snapshot {
            Some(snapshot) => match Body::decode_for(&snapshot.meta, &snapshot.bytes) {
                Ok(body) => Applied {
                    last_applied: body.last_applied,
                    last_membership: body.last_membership,
                    state: body.state,
                },
                Err(error) => {
                    tracing::error!(%error, "simulated snapshot unreadable");
                    Applied::default()
                }
            },
            None => Applied::default(),
        };
        let (applied_index, _) = watch::channel(index_of(&applied.last_applied));
        SimStateMachine {
            disk,
            life,
            applied: Arc::new(RwLock::new(applied)),
            applied_index: Arc::new(applied_index),
            snapshot_write: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Runs `f` on the current state under the read lock.
    pub fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        f(&self.lock_read().state)
    }

    /// Index of the last applied entry (`0` when none).
    pub fn last_applied_index(&self) -> u64 {
        index_of(&self.lock_read().last_applied)
    }

    /// A receiver of the last applied index, updated after every applied
    /// batch and installed snapshot.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied_index.subscribe()
    }

    fn lock_read(&self) -> RwLockReadGuard<'_, Applied> {
        self.applied.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn apply_entries(
        &self,
        entries: impl IntoIterator<Item = Entry<TypeConfig>>,
    ) -> Result<Vec<Response>, SimDiskError> {
        let mut applied = self.applied.write().unwrap_or_else(PoisonError::into_inner);
        let mut responses = Vec::new();
        let mut outcome = Ok(());
        for entry in entries {
            if let Some(last) = &applied.last_applied
                && entry.log_id.index <= last.index
            {
                outcome = Err(SimDiskError::ApplyOutOfOrder {
                    index: entry.log_id.index,
                    last_applied: last.index,
                });
                break;
            }
            let entry = if self.disk.planted(Bug::AckWithoutTokenCheck) {
                ack_with_current_token(&applied.state, entry)
            } else {
                entry
            };
            // Exactly one response per entry, Raft-internal ones included.
            let applied = &mut *applied;
            let response = leasehold_raft::apply_entry(
                &mut applied.state,
                &mut applied.last_membership,
                &entry,
            );
            applied.last_applied = Some(entry.log_id);
            responses.push(response);
        }
        let index = index_of(&applied.last_applied);
        drop(applied);
        self.applied_index.send_replace(index);
        outcome.map(|()| responses)
    }

    /// Writes `snapshot` and returns once it is durable; with `keep_newer`,
    /// a persisted snapshot further along the log stays.
    async fn persist(
        &self,
        snapshot: StoredSnapshot,
        keep_newer: bool,
    ) -> Result<(), SimDiskError> {
        let _writer = self.snapshot_write.lock().await;
        let current = self.disk.read(self.life, |image| image.snapshot.clone())?;
        if keep_newer
            && let Some(current) = current
            && current.meta.last_log_id > snapshot.meta.last_log_id
        {
            return Ok(());
        }
        self.disk.write_durably(self.life, Write::Snapshot(snapshot)).await
    }

    async fn build(&self) -> Result<Snapshot<TypeConfig>, SimDiskError> {
        let (meta, bytes) = {
            let applied = self.lock_read();
            let bytes = bincode::serialize(&BodyRef {
                last_applied: &applied.last_applied,
                last_membership: &applied.last_membership,
                state: &applied.state,
            })
            .map_err(|source| SimDiskError::Codec { what: "snapshot body", source })?;
            let serial = self.disk.next_serial(self.life)?;
            let position = match &applied.last_applied {
                Some(log_id) => format!("{}-{}", log_id.leader_id.term, log_id.index),
                None => "empty".to_string(),
            };
            let meta = Meta {
                last_log_id: applied.last_applied,
                last_membership: applied.last_membership.clone(),
                snapshot_id: format!("{position}-{serial}"),
            };
            (meta, bytes)
        };
        self.persist(StoredSnapshot { meta: meta.clone(), bytes: bytes.clone() }, true).await?;
        Ok(Snapshot { meta, snapshot: Box::new(SnapshotData::in_memory(bytes)) })
    }

    async fn install(&self, meta: &Meta, bytes: Vec<u8>) -> Result<(), SimDiskError> {
        let body = Body::decode_for(meta, &bytes)?;
        // Durable first: once the state moves, openraft may purge the log
        // the snapshot covers.
        self.persist(StoredSnapshot { meta: meta.clone(), bytes }, false).await?;
        let index = index_of(&body.last_applied);
        {
            let mut applied = self.applied.write().unwrap_or_else(PoisonError::into_inner);
            *applied = Applied {
                last_applied: body.last_applied,
                last_membership: body.last_membership,
                state: body.state,
            };
        }
        self.applied_index.send_replace(index);
        Ok(())
    }
}

/// The state under the store's read lock (the replica runtime's reads).
struct StateRead<'a>(RwLockReadGuard<'a, Applied>);

impl Deref for StateRead<'_> {
    type Target = State;

    fn deref(&self) -> &State {
        &self.0.state
    }
}

impl ReplicaStateMachine for SimStateMachine {
    fn state(&self) -> StateGuard<'_> {
        Box::new(StateRead(self.lock_read()))
    }

    fn subscribe(&self) -> watch::Receiver<u64> {
        SimStateMachine::subscribe(self)
    }

    fn snapshot_lock_hold_longest(&self) -> Option<Duration> {
        None
    }

    /// The simulation's states are small: hashed whole, under the lock
    /// that also holds the index they are at.
    fn recent_digest(&self) -> BoxFuture<'_, Result<Option<StateDigest>, StoreError>> {
        Box::pin(async move {
            let applied = self.lock_read();
            let digest = leasehold_replica::stores::digest_of(&applied.state);
            Ok(Some(StateDigest { index: index_of(&applied.last_applied), digest }))
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for SimStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        self.build().await.map_err(|error| StorageIOError::write_snapshot(None, &error).into())
    }
}

impl RaftStateMachine<TypeConfig> for SimStateMachine {
    type SnapshotBuilder = SimStateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, Membership), StorageError<NodeId>> {
        let applied = self.lock_read();
        Ok((applied.last_applied, applied.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.apply_entries(entries)
            .map_err(|error| StorageIOError::write_state_machine(&error).into())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<SnapshotData>, StorageError<NodeId>> {
        Ok(Box::new(SnapshotData::receive_in_memory()))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError<NodeId>> {
        let install = async {
            // The simulated disk receives into memory: reading from a
            // `Cursor` neither fails nor yields.
            let bytes = match snapshot.finish().await {
                Ok(Received::Memory(bytes)) => bytes,
                Ok(Received::File(_)) | Err(_) => {
                    return Err(SimDiskError::Inconsistent {
                        snapshot_id: meta.snapshot_id.clone(),
                        detail: "not received into memory".to_string(),
                    });
                }
            };
            self.install(meta, bytes).await
        };
        install
            .await
            .map_err(|error| StorageIOError::write_snapshot(Some(meta.signature()), &error).into())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let _writer = self.snapshot_write.lock().await;
        let snapshot = self
            .disk
            .read(self.life, |image| image.snapshot.clone())
            .map_err(|error| StorageError::from(StorageIOError::read_snapshot(None, &error)))?;
        Ok(snapshot.map(|snapshot| Snapshot {
            meta: snapshot.meta,
            snapshot: Box::new(SnapshotData::in_memory(snapshot.bytes)),
        }))
    }
}
