//! Bytes an acknowledgement depends on, made to survive a power cut, not
//! only a process crash, for the files the stores keep beside the raft log
//! (which syncs its own): [`replace_file_with`] writes a whole file so that
//! after a power cut either the old file or the new one is there, complete:
//! a temporary file, fsynced, renamed over the old one, the directory
//! fsynced.

use std::fs::File;
use std::path::Path;

use crate::StorageError;

/// Replaces `dir/name` with what `write` writes to it, durably: nothing is
/// reported written before the bytes and the directory entry are on stable
/// storage. The file is streamed, never built in memory first. Returns what
/// `write` returned; an error leaves the old file in place and removes the
/// temporary one (a snapshot that did not fit must not keep the space the
/// log needs).
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
    let written: Result<T, StorageError> = (|| {
        let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
        let written = write(&mut writer)?;
        let file =
            writer.into_inner().map_err(|error| error.into_error()).map_err(io("write", &temp))?;
        file.sync_all().map_err(io("fsync", &temp))?;
        drop(file);
        std::fs::rename(&temp, &target).map_err(io("rename", &target))?;
        Ok(written)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    let written = written?;
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

/// Creates `path` and any missing parents, then fsyncs the parent of each
/// directory it created, so that their names survive a power cut too. On
/// a journalling file system any later fsync would commit them, but on
/// one without a journal (ext2, ext4 made without one) only a sync of the
/// directory that holds a name makes that name durable; without it the
/// whole data directory, its vote and acknowledged entries with it, could
/// vanish after a node's first start.
///
/// The directories it creates are the node user's alone (mode 0700,
/// whatever the umask): the log and the snapshot hold every job's payload
/// and result, which a tokens file keeps from other callers over the
/// network, and other accounts on the machine must not read them off disk.
pub(crate) fn create_dir_all_durably(path: &Path) -> Result<(), StorageError> {
    use std::os::unix::fs::DirBuilderExt;

    let missing: Vec<&Path> =
        path.ancestors().take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists()).collect();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|source| StorageError::CreateDir { path: path.to_path_buf(), source })?;
    let created = missing.len();
    for (index, dir) in missing.into_iter().enumerate() {
        let parent = match dir.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        match File::open(parent).and_then(|handle| handle.sync_all()) {
            Ok(()) => {}
            // The one parent this did not create may be one the node can
            // enter but not read (mode 0711): its name for our directory
            // then rests on the file system, as it did before this sync.
            Err(error)
                if index + 1 == created && error.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                tracing::warn!(dir = %parent.display(), %error, "cannot sync the data directory's parent; its entry is not made durable here");
            }
            Err(source) => {
                return Err(StorageError::Io { what: "fsync", path: parent.to_path_buf(), source });
            }
        }
    }
    Ok(())
}

/// Reads `dir/name`, `None` when it does not exist.
#[cfg(test)]
pub(crate) fn read_file(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, StorageError> {
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(StorageError::Io { what: "read", path, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::Write;

    #[test]
    fn the_directories_it_creates_are_the_owners_alone() -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;

        let dir = tempfile::tempdir()?;
        let data = dir.path().join("srv").join("leasehold");
        create_dir_all_durably(&data)?;
        for created in [dir.path().join("srv"), data] {
            let mode = std::fs::metadata(&created)?.permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}: {mode:o}", created.display());
        }
        Ok(())
    }

    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_no_temporary_is_left() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let write = |bytes: &'static [u8]| {
            move |file: &mut std::io::BufWriter<File>| {
                file.write_all(bytes).map_err(|source| StorageError::Io {
                    what: "write",
                    path: std::path::PathBuf::from("snap"),
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
        assert!(!dir.path().join("snap.tmp").exists(), "a failed write leaves no temporary");
        assert_eq!(read_file(dir.path(), "snap")?.as_deref(), Some(&b"two"[..]));
        assert_eq!(read_file(dir.path(), "missing")?, None);
        let names: Vec<_> = std::fs::read_dir(dir.path())?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        assert_eq!(names, vec![std::ffi::OsString::from("snap")]);
        Ok(())
    }
}
