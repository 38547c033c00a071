//! A file system for power-cut tests: it keeps everything in memory, serves
//! it through FUSE like any other mount, and on [`Mounted::cut`] writes out
//! only what a disk would still hold after the power went: for each file,
//! its bytes as of its last fsync (nothing, if it was never synced), under
//! the names the directories had at the last fsync of any file or
//! directory.
//!
//! That is the contract applications may rely on, a little kinder than
//! POSIX on names: a journalling file system (ext4, XFS) commits creations,
//! renames and removals with the next journal commit, which any fsync
//! forces, but writes a file's data only when that file is synced (with
//! delayed allocation, unsynced data has not even been placed). A program
//! that acknowledges before syncing the bytes it acknowledged loses them
//! here, exactly as it would on a real power cut.
//!
//! Mounting needs `/dev/fuse` and the right to mount (root, or a user
//! namespace that allows it); [`Mounted::new`] answers
//! [`PowerCutError::Unavailable`] when the machine cannot, so a test can
//! say so instead of passing silently.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyWrite, Request, TimeOrNow,
};

/// Why a power-cut mount could not be had or written out.
#[derive(Debug, thiserror::Error)]
pub enum PowerCutError {
    /// This machine cannot mount FUSE here (no `/dev/fuse`, no permission).
    #[error("cannot mount a FUSE file system here")]
    Unavailable(#[source] std::io::Error),
    /// Writing the surviving files out failed.
    #[error("cannot write the surviving files to {path}")]
    Write {
        /// Where.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The root directory's inode (FUSE's fixed number).
const ROOT: u64 = 1;
/// The kernel asks again for every attribute and name: the tests rename and
/// remove under it, and no cache may hide that.
const TTL: Duration = Duration::ZERO;

#[derive(Debug)]
enum Node {
    File {
        /// What reads see now.
        data: Vec<u8>,
        /// What survives a power cut: the bytes at the last fsync.
        synced: Vec<u8>,
    },
    Dir,
}

/// The whole file system: inodes, and the names as they are now and as
/// of the last commit.
#[derive(Debug, Default)]
struct Disk {
    nodes: BTreeMap<u64, Node>,
    /// (parent, name) → inode, now.
    names: BTreeMap<(u64, OsString), u64>,
    /// (parent, name) → inode, as of the last fsync of anything.
    committed: BTreeMap<(u64, OsString), u64>,
    next: u64,
    /// Fsyncs seen (files and directories), for tests of the tests.
    fsyncs: u64,
    /// Fsyncs seen of each file, by inode.
    file_fsyncs: BTreeMap<u64, u64>,
    /// Fsyncs seen of each directory, by inode.
    dir_fsyncs: BTreeMap<u64, u64>,
}

impl Disk {
    /// The inode at `path`, relative to the root, now.
    fn lookup(&self, path: &Path) -> Option<u64> {
        let mut ino = ROOT;
        for part in path.components() {
            ino = *self.names.get(&(ino, part.as_os_str().to_os_string()))?;
        }
        Some(ino)
    }

    fn new() -> Self {
        let mut disk = Disk { next: ROOT + 1, ..Disk::default() };
        disk.nodes.insert(ROOT, Node::Dir);
        disk
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm) = match self.nodes.get(&ino)? {
            Node::File { data, .. } => (FileType::RegularFile, data.len() as u64, 0o644),
            Node::Dir => (FileType::Directory, 0, 0o755),
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: SystemTime::UNIX_EPOCH,
            mtime: SystemTime::UNIX_EPOCH,
            ctime: SystemTime::UNIX_EPOCH,
            crtime: SystemTime::UNIX_EPOCH,
            kind,
            perm,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    fn add(&mut self, parent: u64, name: &OsStr, node: Node) -> Result<FileAttr, i32> {
        if !matches!(self.nodes.get(&parent), Some(Node::Dir)) {
            return Err(libc::ENOTDIR);
        }
        if self.names.contains_key(&(parent, name.to_os_string())) {
            return Err(libc::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        self.nodes.insert(ino, node);
        self.names.insert((parent, name.to_os_string()), ino);
        self.attr(ino).ok_or(libc::EIO)
    }

    fn children(&self, parent: u64) -> impl Iterator<Item = (&OsString, u64)> {
        self.names
            .iter()
            .filter(move |((p, _), _)| *p == parent)
            .map(|((_, name), ino)| (name, *ino))
    }

    fn commit(&mut self) {
        self.committed = self.names.clone();
        self.fsyncs += 1;
    }

    /// Writes what survives a power cut under `dir`.
    fn write_out(&self, dir: &Path, parent: u64) -> std::io::Result<()> {
        for ((p, name), ino) in &self.committed {
            if *p != parent {
                continue;
            }
            let path = dir.join(name);
            match self.nodes.get(ino) {
                Some(Node::File { synced, .. }) => std::fs::write(&path, synced)?,
                Some(Node::Dir) => {
                    std::fs::create_dir(&path)?;
                    self.write_out(&path, *ino)?;
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// The FUSE side: every call takes the one lock.
struct Fs(Arc<Mutex<Disk>>);

impl Fs {
    fn disk(&self) -> MutexGuard<'_, Disk> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Filesystem for Fs {
    fn lookup(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let disk = self.disk();
        match disk.names.get(&(parent, name.to_os_string())).and_then(|ino| disk.attr(*ino)) {
            Some(attr) => reply.entry(&TTL, &attr, 0),
            None => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request<'_>, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.disk().attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(libc::ENOENT),
        }
    }

    fn setattr(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<u64>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<u32>,
        reply: ReplyAttr,
    ) {
        let mut disk = self.disk();
        if let (Some(size), Some(Node::File { data, .. })) = (size, disk.nodes.get_mut(&ino)) {
            match usize::try_from(size) {
                Ok(size) => data.resize(size, 0),
                Err(_) => return reply.error(libc::EFBIG),
            }
        }
        match disk.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(libc::ENOENT),
        }
    }

    fn mkdir(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        match self.disk().add(parent, name, Node::Dir) {
            Ok(attr) => reply.entry(&TTL, &attr, 0),
            Err(errno) => reply.error(errno),
        }
    }

    fn unlink(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        // The inode stays for whoever still has it open; only the name goes.
        match self.disk().names.remove(&(parent, name.to_os_string())) {
            Some(_) => reply.ok(),
            None => reply.error(libc::ENOENT),
        }
    }

    fn rmdir(&mut self, _req: &Request<'_>, parent: u64, name: &OsStr, reply: ReplyEmpty) {
        let mut disk = self.disk();
        let key = (parent, name.to_os_string());
        let Some(ino) = disk.names.get(&key).copied() else {
            return reply.error(libc::ENOENT);
        };
        if disk.children(ino).next().is_some() {
            return reply.error(libc::ENOTEMPTY);
        }
        disk.names.remove(&key);
        reply.ok();
    }

    fn rename(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        _flags: u32,
        reply: ReplyEmpty,
    ) {
        let mut disk = self.disk();
        match disk.names.remove(&(parent, name.to_os_string())) {
            Some(ino) => {
                disk.names.insert((newparent, newname.to_os_string()), ino);
                reply.ok();
            }
            None => reply.error(libc::ENOENT),
        }
    }

    fn open(&mut self, _req: &Request<'_>, ino: u64, _flags: i32, reply: ReplyOpen) {
        match self.disk().nodes.get(&ino) {
            Some(_) => reply.opened(0, 0),
            None => reply.error(libc::ENOENT),
        }
    }

    fn read(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyData,
    ) {
        let disk = self.disk();
        let Some(Node::File { data, .. }) = disk.nodes.get(&ino) else {
            return reply.error(libc::EISDIR);
        };
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
        let end = start.saturating_add(size as usize).min(data.len());
        reply.data(&data[start..end]);
    }

    fn write(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        bytes: &[u8],
        _write_flags: u32,
        _flags: i32,
        _lock_owner: Option<u64>,
        reply: ReplyWrite,
    ) {
        let mut disk = self.disk();
        let Some(Node::File { data, .. }) = disk.nodes.get_mut(&ino) else {
            return reply.error(libc::EISDIR);
        };
        let Ok(start) = usize::try_from(offset) else {
            return reply.error(libc::EINVAL);
        };
        let end = start.saturating_add(bytes.len());
        if data.len() < end {
            data.resize(end, 0);
        }
        data[start..end].copy_from_slice(bytes);
        reply.written(u32::try_from(bytes.len()).unwrap_or(u32::MAX));
    }

    fn flush(&mut self, _req: &Request<'_>, _ino: u64, _fh: u64, _owner: u64, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut disk = self.disk();
        if let Some(Node::File { data, synced }) = disk.nodes.get_mut(&ino) {
            synced.clone_from(data);
            *disk.file_fsyncs.entry(ino).or_default() += 1;
        }
        disk.commit();
        reply.ok();
    }

    fn readdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        offset: i64,
        mut reply: ReplyDirectory,
    ) {
        let disk = self.disk();
        let mut entries = vec![
            (ino, FileType::Directory, OsString::from(".")),
            (ino, FileType::Directory, OsString::from("..")),
        ];
        for (name, child) in disk.children(ino) {
            let kind = match disk.nodes.get(&child) {
                Some(Node::Dir) => FileType::Directory,
                _ => FileType::RegularFile,
            };
            entries.push((child, kind, name.clone()));
        }
        let skip = usize::try_from(offset).unwrap_or(0);
        for (index, (child, kind, name)) in entries.into_iter().enumerate().skip(skip) {
            let next = i64::try_from(index + 1).unwrap_or(i64::MAX);
            if reply.add(child, next, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &mut self,
        _req: &Request<'_>,
        ino: u64,
        _fh: u64,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut disk = self.disk();
        *disk.dir_fsyncs.entry(ino).or_default() += 1;
        disk.commit();
        reply.ok();
    }

    fn create(
        &mut self,
        _req: &Request<'_>,
        parent: u64,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let node = Node::File { data: Vec::new(), synced: Vec::new() };
        match self.disk().add(parent, name, node) {
            Ok(attr) => reply.created(&TTL, &attr, 0, 0, 0),
            Err(errno) => reply.error(errno),
        }
    }
}

/// A mounted power-cut file system. Dropping it unmounts.
pub struct Mounted {
    disk: Arc<Mutex<Disk>>,
    // Declared before the mount point, so it unmounts before the directory
    // is removed.
    session: Option<fuser::BackgroundSession>,
    mount_point: tempfile::TempDir,
}

impl Mounted {
    /// Mounts an empty power-cut file system on a new temporary directory.
    pub fn new() -> Result<Self, PowerCutError> {
        let mount_point = tempfile::tempdir().map_err(PowerCutError::Unavailable)?;
        let disk = Arc::new(Mutex::new(Disk::new()));
        let options = [MountOption::FSName("leasehold-powercut".to_string()), MountOption::RW];
        let session = fuser::spawn_mount2(Fs(disk.clone()), mount_point.path(), &options)
            .map_err(PowerCutError::Unavailable)?;
        Ok(Mounted { disk, session: Some(session), mount_point })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.mount_point.path()
    }

    /// How many fsyncs (of files or directories) it has seen.
    pub fn fsyncs(&self) -> u64 {
        self.disk.lock().unwrap_or_else(PoisonError::into_inner).fsyncs
    }

    /// How many fsyncs it has seen of the files directly in `dir`, a path
    /// relative to the mount point (0 when there is no such directory):
    /// the syncs of one program's files, whatever another one sharing the
    /// mount syncs meanwhile.
    pub fn file_fsyncs_in(&self, dir: &Path) -> u64 {
        let disk = self.disk.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(ino) = disk.lookup(dir) else { return 0 };
        disk.children(ino)
            .map(|(_, child)| disk.file_fsyncs.get(&child).copied().unwrap_or(0))
            .sum()
    }

    /// How many fsyncs it has seen of the directory `dir` itself, a path
    /// relative to the mount point (`""` for the root; 0 when there is no
    /// such directory): what makes the names in it durable on a file
    /// system without a journal.
    pub fn dir_fsyncs_of(&self, dir: &Path) -> u64 {
        let disk = self.disk.lock().unwrap_or_else(PoisonError::into_inner);
        disk.lookup(dir).map_or(0, |ino| disk.dir_fsyncs.get(&ino).copied().unwrap_or(0))
    }

    /// Cuts the power: writes what survives, as it stands at this instant,
    /// to a new temporary directory and returns it. The mount itself goes
    /// on serving (the program on it has not noticed yet); drop it after
    /// the program let go of its files.
    pub fn cut(&self) -> Result<tempfile::TempDir, PowerCutError> {
        let out = tempfile::tempdir()
            .map_err(|source| PowerCutError::Write { path: std::env::temp_dir(), source })?;
        let disk = self.disk.lock().unwrap_or_else(PoisonError::into_inner);
        disk.write_out(out.path(), ROOT)
            .map_err(|source| PowerCutError::Write { path: out.path().to_path_buf(), source })?;
        Ok(out)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // Unmounts (lazily, if something still holds a file open).
        self.session.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A mount, or `None` (with a note) where this machine cannot mount.
    fn mount() -> Option<Mounted> {
        match Mounted::new() {
            Ok(mounted) => Some(mounted),
            Err(error) => {
                eprintln!("power-cut file system unavailable here: {error}");
                assert!(
                    std::env::var_os("LEASEHOLD_REQUIRE_POWER_CUT").is_none(),
                    "LEASEHOLD_REQUIRE_POWER_CUT is set, but: {error:?}"
                );
                None
            }
        }
    }

    #[test]
    fn only_synced_bytes_under_committed_names_survive_the_cut()
    -> Result<(), Box<dyn std::error::Error>> {
        let Some(fs) = mount() else { return Ok(()) };
        let root = fs.path();
        std::fs::create_dir(root.join("dir"))?;
        let mut synced = std::fs::File::create(root.join("dir/synced"))?;
        synced.write_all(b"kept")?;
        synced.sync_data()?;
        synced.write_all(b" and lost")?;
        std::fs::write(root.join("never-synced"), b"lost")?;
        // Renamed after the last fsync: the old name survives.
        std::fs::write(root.join("renamed-late"), b"")?;
        std::fs::File::open(root)?.sync_all()?;
        std::fs::rename(root.join("renamed-late"), root.join("new-name"))?;
        assert_eq!(std::fs::read(root.join("dir/synced"))?, b"kept and lost", "reads see it all");

        let image = fs.cut()?;
        assert_eq!(std::fs::read(image.path().join("dir/synced"))?, b"kept");
        assert_eq!(std::fs::read(image.path().join("never-synced"))?, b"");
        assert!(image.path().join("renamed-late").exists());
        assert!(!image.path().join("new-name").exists());
        assert!(fs.fsyncs() >= 2);
        Ok(())
    }
}
