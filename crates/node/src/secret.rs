//! Where the cluster secret comes from: the configuration, a file, or one
//! generated at the first start and kept in the data dir. It is never sent
//! over the network (see docs/security.md).

use std::io::Write;
use std::path::{Path, PathBuf};

use leasehold_security::ClusterSecret;

use crate::config::{Config, ConfigError, SecretText};

/// Name of the file in the data dir that keeps a generated secret.
pub const DEV_SECRET_FILE: &str = "cluster-secret";

/// Where the secret came from.
pub struct ResolvedSecret {
    /// The secret.
    pub secret: ClusterSecret,
    /// Generated here (not configured): kept in the data dir, never sent.
    pub generated: bool,
    /// Newly generated at this start and not yet shared with anyone.
    pub fresh: bool,
}

/// The cluster secret in order: `cluster_secret` (config or
/// `LEASEHOLD_CLUSTER_SECRET`), `cluster_secret_file`, a dev secret kept in
/// the data dir, or a new random one (to be kept there).
pub fn resolve_secret(config: &Config) -> Result<ResolvedSecret, ConfigError> {
    let invalid = |field, problem: String| ConfigError::Invalid { field, problem };
    if let Some(SecretText(text)) = &config.cluster_secret {
        let secret =
            ClusterSecret::from_text(text).map_err(|e| invalid("cluster_secret", e.to_string()))?;
        return Ok(ResolvedSecret { secret, generated: false, fresh: false });
    }
    if let Some(path) = &config.cluster_secret_file {
        let unreadable = |error: std::io::Error| {
            invalid("cluster_secret_file", format!("{}: {error}", path.display()))
        };
        if let Err(loose) = leasehold_security::file_mode::check(path, true).map_err(unreadable)? {
            return Err(invalid("cluster_secret_file", format!("{}: {loose}", path.display())));
        }
        let text = std::fs::read_to_string(path).map_err(unreadable)?;
        let secret = ClusterSecret::from_text(&text)
            .map_err(|e| invalid("cluster_secret_file", format!("{}: {e}", path.display())))?;
        return Ok(ResolvedSecret { secret, generated: false, fresh: false });
    }
    let kept = dev_secret_path(&config.data);
    match std::fs::read_to_string(&kept) {
        Ok(text) => {
            if let Ok(secret) = ClusterSecret::from_text(&text) {
                return Ok(ResolvedSecret { secret, generated: true, fresh: false });
            }
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        // A kept secret this process cannot read (another user's file, a
        // start as the wrong user) is the cluster's, and is not replaced.
        Err(error) => {
            let problem = format!(
                "{}: the kept cluster secret cannot be read ({error}); start the node as the \
                 user that owns it",
                kept.display()
            );
            return Err(invalid("data", problem));
        }
    }
    Ok(ResolvedSecret { secret: ClusterSecret::generate(), generated: true, fresh: true })
}

/// Where a dev secret is kept.
pub fn dev_secret_path(data: &Path) -> PathBuf {
    data.join(DEV_SECRET_FILE)
}

/// Keeps a dev secret in the data dir (owner-readable only), so a restart
/// keeps talking to the same cluster. Written to a new file that replaces
/// the old one, so the file is owner-only whatever one it replaces (an
/// unreadable leftover kept its own mode when truncated), and a crash
/// leaves the old file or the whole new one, never an empty one, which
/// the next start would take for no secret and replace with another.
pub fn keep_dev_secret(data: &Path, secret: &ClusterSecret) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dev_secret_path(data);
    let temp = data.join(format!("{DEV_SECRET_FILE}.tmp"));
    match std::fs::remove_file(&temp) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let mut file =
        std::fs::OpenOptions::new().create_new(true).write(true).mode(0o600).open(&temp)?;
    file.write_all(secret.as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temp, &path)?;
    std::fs::File::open(data)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_comes_from_config_then_file_then_the_data_dir_then_is_generated()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data)?;
        let file = dir.path().join("secret.txt");
        std::fs::write(&file, "a secret kept in a file\n")?;
        let mut config = Config {
            data: data.clone(),
            cluster_secret: Some(SecretText("the configured cluster secret".into())),
            cluster_secret_file: Some(file.clone()),
            ..Config::default()
        };
        let configured = resolve_secret(&config)?;
        assert_eq!(configured.secret.as_bytes(), b"the configured cluster secret");
        assert!(!configured.generated);

        config.cluster_secret = None;
        let from_file = resolve_secret(&config)?;
        assert_eq!(from_file.secret.as_bytes(), b"a secret kept in a file");
        assert!(!from_file.generated);

        config.cluster_secret_file = None;
        let fresh = resolve_secret(&config)?;
        assert!(fresh.generated && fresh.fresh);
        keep_dev_secret(&data, &fresh.secret)?;
        let kept = resolve_secret(&config)?;
        assert!(kept.generated && !kept.fresh);
        assert_eq!(kept.secret, fresh.secret, "a restart keeps the dev secret");

        // A leftover the node could not read as a secret, readable by all:
        // replaced by an owner-only file holding the secret.
        use std::os::unix::fs::PermissionsExt;
        let kept_path = dev_secret_path(&data);
        std::fs::write(&kept_path, "")?;
        std::fs::set_permissions(&kept_path, std::fs::Permissions::from_mode(0o644))?;
        let again = resolve_secret(&config)?;
        assert!(again.fresh, "an empty file is no secret");
        keep_dev_secret(&data, &again.secret)?;
        let mode = std::fs::metadata(&kept_path)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the kept secret is owner-only");
        assert_eq!(std::fs::read(&kept_path)?, again.secret.as_bytes());

        // A kept secret that cannot be read is not replaced (a directory in
        // its place stands for one the node's user may not read).
        std::fs::remove_file(&kept_path)?;
        std::fs::create_dir(&kept_path)?;
        let unreadable = resolve_secret(&config).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(unreadable.contains("cannot be read"), "{unreadable}");
        std::fs::remove_dir(&kept_path)?;

        // A secret file any user may write is refused; one others may read
        // is taken (the node warns).
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o646))?;
        config.cluster_secret_file = Some(file.clone());
        let refused = resolve_secret(&config).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("cluster_secret_file") && refused.contains("0646"), "{refused}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))?;
        assert_eq!(resolve_secret(&config)?.secret.as_bytes(), b"a secret kept in a file");

        std::fs::write(&file, "short")?;
        config.cluster_secret_file = Some(file);
        let refused = resolve_secret(&config).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("cluster_secret_file"), "{refused}");
        Ok(())
    }
}
