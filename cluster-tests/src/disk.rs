//! The disk-full mode: each node's data dir on its own size-limited tmpfs,
//! filled to ENOSPC with a ballast file and emptied again (a tmpfs gives
//! ENOSPC when full and takes writes again as soon as space is freed — no
//! kernel fault injection is needed). Mounting needs root; where `mount`
//! is refused, the harness says so and skips the disk-full rounds.
//!
//! Every mount is undone when the [`Disks`] is dropped (lazily, so a node
//! process that still holds files there cannot keep it mounted).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Name of the ballast file in a full data dir.
pub const BALLAST: &str = "chaos-ballast";

/// The tmpfs mounts of one run.
#[derive(Default)]
pub struct Disks {
    mounts: Vec<PathBuf>,
    /// Why mounting was not possible, if it was not.
    pub unavailable: Option<String>,
}

impl Disks {
    /// Mounts a tmpfs of `size_mb` MiB on each of `dirs` (created first).
    /// If a mount is refused, undoes the others and remembers why.
    pub fn mount(dirs: &[PathBuf], size_mb: u64) -> Disks {
        let mut disks = Disks::default();
        for dir in dirs {
            if let Err(error) = std::fs::create_dir_all(dir) {
                disks.give_up(format!("creating {}: {error}", dir.display()));
                return disks;
            }
            let output = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m,mode=0755"), "tmpfs"])
                .arg(dir)
                .output();
            match output {
                Ok(out) if out.status.success() => disks.mounts.push(dir.clone()),
                Ok(out) => {
                    disks.give_up(format!(
                        "mount -t tmpfs on {} failed: {}",
                        dir.display(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    ));
                    return disks;
                }
                Err(error) => {
                    disks.give_up(format!("cannot run mount: {error}"));
                    return disks;
                }
            }
        }
        disks
    }

    fn give_up(&mut self, why: String) {
        tracing::warn!(%why, "disk-full mode unavailable: data dirs stay on the ordinary disk and disk-full rounds are skipped");
        self.unmount_all();
        self.unavailable = Some(why);
    }

    /// Whether `dir` is one of the tmpfs mounts.
    pub fn is_mounted(&self, dir: &Path) -> bool {
        self.mounts.iter().any(|m| m == dir)
    }

    fn unmount_all(&mut self) {
        for dir in self.mounts.drain(..) {
            let _ = Command::new("umount").arg("-l").arg(&dir).output();
        }
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        self.unmount_all();
    }
}

/// Fills `dir` with a ballast file until a write fails with ENOSPC (or
/// `limit_bytes` is written); answers the bytes written and whether ENOSPC
/// was reached.
pub fn fill(dir: &Path, limit_bytes: u64) -> anyhow::Result<(u64, bool)> {
    let path = dir.join(BALLAST);
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path)?;
    let chunk = vec![0xa5u8; 256 * 1024];
    let mut written = 0u64;
    while written < limit_bytes {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(error) if error.raw_os_error() == Some(28) => return Ok((written, true)),
            Err(error) => return Err(error.into()),
        }
    }
    // A partial write may stop short of the error: one more small write tells.
    match file.write(&[0u8; 4096]).and_then(|_| file.flush()) {
        Err(error) if error.raw_os_error() == Some(28) => Ok((written, true)),
        _ => Ok((written, false)),
    }
}

/// Removes the ballast from `dir` (no ballast: nothing to do).
pub fn empty(dir: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(dir.join(BALLAST)) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_stops_at_the_limit_and_empty_removes_the_ballast() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let (written, full) = fill(dir.path(), 1024 * 1024)?;
        assert!(written >= 1024 * 1024);
        assert!(!full, "an ordinary disk is not full after 1 MiB");
        empty(dir.path())?;
        assert!(!dir.path().join(BALLAST).exists());
        empty(dir.path())?;
        Ok(())
    }

    #[test]
    fn a_small_tmpfs_fills_to_enospc_when_mounting_is_allowed() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let mount = dir.path().join("n1");
        let disks = Disks::mount(std::slice::from_ref(&mount), 4);
        if let Some(why) = &disks.unavailable {
            eprintln!("skipped: {why}");
            return Ok(());
        }
        assert!(disks.is_mounted(&mount));
        let (written, full) = fill(&mount, 64 * 1024 * 1024)?;
        // On failure, say what the kernel thinks is mounted there.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let here: Vec<&str> =
            mounts.lines().filter(|l| l.contains(&*mount.to_string_lossy())).collect();
        assert!(full, "4 MiB tmpfs not full after {written} bytes; mounts there: {here:?}");
        assert!(written <= 4 * 1024 * 1024, "{written} bytes on a 4 MiB tmpfs; mounts: {here:?}");
        empty(&mount)?;
        // The ballast's space returns once its last handle closes: a process
        // another test thread forks at that moment holds a copy of the
        // handle until it execs, so allow a moment for that.
        let mut attempts = 0;
        while let Err(error) = std::fs::write(mount.join("after"), b"space again") {
            attempts += 1;
            anyhow::ensure!(
                error.raw_os_error() == Some(28) && attempts < 100,
                "no space again after emptying ({attempts} tries): {error}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        drop(disks);
        Ok(())
    }
}
