//! A test-only failpoint shared by the log store and the state machine store
//! of one database: while it is on, every write that must reach the disk
//! fails as if the device returned EIO.
//!
//! There is no kernel fault injection on the machines leasehold is tested on,
//! so readiness and crash tests flip this switch instead. It costs one atomic
//! load per write when off.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::StorageError;

/// A shared on/off switch; clones see the same flag.
#[derive(Clone, Debug, Default)]
pub(crate) struct Failpoint {
    on: Arc<AtomicBool>,
}

impl Failpoint {
    /// Turns the injected fault on or off for every store sharing this flag.
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
    }

    /// Fails with [`StorageError::Fault`] while the fault is on.
    pub(crate) fn check(&self) -> Result<(), StorageError> {
        if self.on.load(Ordering::SeqCst) {
            return Err(StorageError::Fault);
        }
        Ok(())
    }
}
