//! Bytes an acknowledgement depends on, made to survive a power cut, not
//! only a process crash.
//!
//! - [`replace_file_with`] writes a whole file so that after a power cut either
//!   the old file or the new one is there, complete: a temporary file,
//!   fsynced, renamed over the old one, the directory fsynced.
//! - [`BlobSync`] fsyncs sled's blob files. sled 0.34 writes a page larger
//!   than a quarter of its 512 KiB segment (a large entry, a snapshot, a leaf
//!   of sixteen entries of 8 KiB) to a file of its own under `blobs/` and
//!   never syncs it; the pointer to it lives in the main file, which the
//!   log store fsyncs. After a power cut the pointer would survive and the
//!   blob not, and sled's recovery stops replay at the missing blob.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::StorageError;

/// Replaces `dir/name` with what `write` writes to it, durably: nothing is
/// reported written before the bytes and the directory entry are on stable
/// storage. The file is streamed, never built in memory first. Returns what
/// `write` returned; an error leaves the old file in place.
pub(crate) fn replace_file_with<T>(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&mut std::io::BufWriter<File>) -> Result<T, StorageError>,
) -> Result<T, StorageError> {
    let temp = dir.join(format!("{name}.tmp"));
    let target = dir.join(name);
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| StorageError::Io { what, path, source }
    };
    let file = File::create(&temp).map_err(io("create", &temp))?;
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
    let written = write(&mut writer)?;
    let file =
        writer.into_inner().map_err(|error| error.into_error()).map_err(io("write", &temp))?;
    file.sync_all().map_err(io("fsync", &temp))?;
    drop(file);
    std::fs::rename(&temp, &target).map_err(io("rename", &target))?;
    sync_dir(dir)?;
    Ok(written)
}

/// Fsyncs a directory, so the entries created or renamed in it last.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir).and_then(|handle| handle.sync_all()).map_err(|source| StorageError::Io {
        what: "fsync",
        path: dir.to_path_buf(),
        source,
    })
}

/// Reads `dir/name`, `None` when it does not exist.
pub(crate) fn read_file(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StorageError::Io { what: "read", path, source }),
    }
}

/// Fsyncs the blob files sled wrote since the last call (see the module
/// docs). Remembers each file's length when it was synced, so a file seen
/// while sled was still writing it is synced again once it grew.
#[derive(Debug)]
pub(crate) struct BlobSync {
    dir: PathBuf,
    synced: Mutex<HashMap<OsString, u64>>,
}

impl BlobSync {
    /// For the sled database at `db_dir`.
    pub(crate) fn new(db_dir: &Path) -> Self {
        BlobSync { dir: db_dir.join("blobs"), synced: Mutex::new(HashMap::new()) }
    }

    /// Fsyncs every blob file not synced at its current length, then the
    /// blob directory if any was. Costs one directory read when there is
    /// nothing new (the usual case: entries are small).
    pub(crate) fn sync_new(&self) -> Result<(), StorageError> {
        let io = |what: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| StorageError::Io { what, path, source }
        };
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(io("list", &self.dir)(source)),
        };
        let mut synced = self.synced.lock().unwrap_or_else(PoisonError::into_inner);
        let mut present = Vec::new();
        let mut any = false;
        for entry in entries {
            let entry = entry.map_err(io("list", &self.dir))?;
            let name = entry.file_name();
            let path = entry.path();
            let len = match entry.metadata() {
                Ok(metadata) => metadata.len(),
                // sled removed it meanwhile (a blob it no longer needs).
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(io("stat", &path)(source)),
            };
            present.push(name.clone());
            if synced.get(&name) == Some(&len) {
                continue;
            }
            match File::open(&path) {
                Ok(file) => file.sync_all().map_err(io("fsync", &path))?,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(io("open", &path)(source)),
            }
            synced.insert(name, len);
            any = true;
        }
        synced.retain(|name, _| present.contains(name));
        if any {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::Write;

    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_no_temporary_is_left() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let write = |bytes: &'static [u8]| {
            move |file: &mut std::io::BufWriter<File>| {
                file.write_all(bytes).map_err(|source| StorageError::Io {
                    what: "write",
                    path: PathBuf::from("snap"),
                    source,
                })
            }
        };
        replace_file_with(dir.path(), "snap", write(b"one"))?;
        replace_file_with(dir.path(), "snap", write(b"two"))?;
        let failed =
            replace_file_with(dir.path(), "snap", |_| Err::<(), _>(StorageError::Poisoned));
        assert!(failed.is_err());
        assert_eq!(
            read_file(dir.path(), "snap")?.as_deref(),
            Some(&b"two"[..]),
            "a failed write keeps the old file"
        );
        std::fs::remove_file(dir.path().join("snap.tmp"))?;
        assert_eq!(read_file(dir.path(), "snap")?.as_deref(), Some(&b"two"[..]));
        assert_eq!(read_file(dir.path(), "missing")?, None);
        let names: Vec<_> = std::fs::read_dir(dir.path())?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        assert_eq!(names, vec![OsString::from("snap")]);
        Ok(())
    }

    #[test]
    fn blob_sync_remembers_what_it_synced_and_forgets_removed_files() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let blobs = BlobSync::new(dir.path());
        blobs.sync_new()?; // no blobs directory yet
        std::fs::create_dir(dir.path().join("blobs"))?;
        std::fs::write(dir.path().join("blobs").join("7"), b"abc")?;
        blobs.sync_new()?;
        let lengths = |blobs: &BlobSync| blobs.synced.lock().map(|s| s.clone()).ok();
        assert_eq!(lengths(&blobs), Some(HashMap::from([(OsString::from("7"), 3)])));
        std::fs::write(dir.path().join("blobs").join("7"), b"abcdef")?;
        blobs.sync_new()?;
        assert_eq!(lengths(&blobs), Some(HashMap::from([(OsString::from("7"), 6)])));
        std::fs::remove_file(dir.path().join("blobs").join("7"))?;
        blobs.sync_new()?;
        assert_eq!(lengths(&blobs), Some(HashMap::new()));
        Ok(())
    }
}
