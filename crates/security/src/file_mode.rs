//! Who else may touch a credentials file: the CA, a certificate, a key, the
//! tokens file, the cluster secret's file.
//!
//! A file that any user of the host may write is refused: whoever writes
//! it chooses the node's credentials (a CA that trusts their certificates,
//! a tokens file with their admin token, a secret of their own). A key or
//! a secret that any user may read, or a file its group may write, is
//! taken with a warning: a mounted secret is often `0644` and owned by
//! root, and where each user has a group of their own, group-writable
//! files are the default. A secret its group may read is the usual way to
//! give it to a service's group (`root:leasehold`, `0640`), and passes.
//! See docs/security.md, "Credentials files".

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A credentials file that users other than its owner and group may write.
#[derive(Debug, thiserror::Error)]
#[error(
    "mode {mode:04o} lets any user write it, and so choose this node's credentials; \
     run chmod o-w on it"
)]
pub struct WritableByAnyone {
    /// The file's permission bits.
    pub mode: u32,
}

/// What the mode of a credentials file gives away, short of refusal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exposure {
    /// Only its owner (and for a secret, its group) may read it, and only
    /// its owner may write it.
    Private,
    /// Its group may write it.
    GroupWritable {
        /// The file's permission bits.
        mode: u32,
    },
    /// A secret any user may read.
    Readable {
        /// The file's permission bits.
        mode: u32,
    },
}

/// Whether a file may serve as credentials. `secret` is true for files
/// whose contents must stay private (a key, the cluster secret), false for
/// those whose contents may be read but must not be replaced (a CA, a
/// certificate, the tokens file, which holds hashes only). The file behind
/// a symbolic link is judged, as that is what is read.
pub fn check(path: &Path, secret: bool) -> std::io::Result<Result<Exposure, WritableByAnyone>> {
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    Ok(judge(mode, secret))
}

fn judge(mode: u32, secret: bool) -> Result<Exposure, WritableByAnyone> {
    if mode & 0o002 != 0 {
        return Err(WritableByAnyone { mode });
    }
    if secret && mode & 0o004 != 0 {
        return Ok(Exposure::Readable { mode });
    }
    if mode & 0o020 != 0 {
        return Ok(Exposure::GroupWritable { mode });
    }
    Ok(Exposure::Private)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_anyone_may_write_is_refused_whatever_it_holds() {
        for secret in [true, false] {
            assert!(judge(0o666, secret).is_err());
            assert!(judge(0o602, secret).is_err());
        }
        assert_eq!(judge(0o600, true).ok(), Some(Exposure::Private));
        assert_eq!(judge(0o644, false).ok(), Some(Exposure::Private));
    }

    #[test]
    fn a_readable_secret_or_a_group_writable_file_is_reported() {
        assert_eq!(judge(0o644, true).ok(), Some(Exposure::Readable { mode: 0o644 }));
        assert_eq!(judge(0o640, true).ok(), Some(Exposure::Private), "root:leasehold 0640");
        assert_eq!(judge(0o664, false).ok(), Some(Exposure::GroupWritable { mode: 0o664 }));
        assert_eq!(judge(0o660, true).ok(), Some(Exposure::GroupWritable { mode: 0o660 }));
    }

    #[test]
    fn the_mode_is_read_through_a_link() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("key");
        std::fs::write(&file, "k")?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o646))?;
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link)?;
        assert!(check(&link, true)?.is_err());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
        assert_eq!(check(&link, true)?.ok(), Some(Exposure::Private));
        Ok(())
    }
}
