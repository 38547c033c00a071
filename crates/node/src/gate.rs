//! The node's side of the cutover gate: where the cluster secret comes
//! from, and the claim seam of a cron tick on the broadcast (bus) path —
//! claim, run the schedule's command on this node, release.
//!
//! Which path a tick takes is decided once, by the driver, with
//! [`leasehold_replica::Gate::decide_for_claim`]; this module only carries a
//! bus decision out. Release goes to both stores: the bus (a no-op unless
//! this node won the key) and the journal (a no-op unless this node holds a
//! lease on a job with that key).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_client::exec::{self, CommandLine};
use leasehold_core::Command;
use leasehold_core::schedule::Schedule;
use leasehold_replica::bus::Outcome;
use leasehold_replica::{Gate, Journal};
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
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.clone(), source })?;
        let secret = ClusterSecret::from_text(&text)
            .map_err(|e| invalid("cluster_secret_file", format!("{}: {e}", path.display())))?;
        return Ok(ResolvedSecret { secret, generated: false, fresh: false });
    }
    let kept = dev_secret_path(&config.data);
    if let Ok(text) = std::fs::read_to_string(&kept)
        && let Ok(secret) = ClusterSecret::from_text(&text)
    {
        return Ok(ResolvedSecret { secret, generated: true, fresh: false });
    }
    Ok(ResolvedSecret { secret: ClusterSecret::generate(), generated: true, fresh: true })
}

/// Where a dev secret is kept.
pub fn dev_secret_path(data: &Path) -> PathBuf {
    data.join(DEV_SECRET_FILE)
}

/// Keeps a dev secret in the data dir (owner-readable only), so a restart
/// keeps talking to the same cluster.
pub fn keep_dev_secret(data: &Path, secret: &ClusterSecret) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dev_secret_path(data);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)?;
    file.write_all(secret.as_bytes())?;
    file.sync_all()
}

/// What a bus tick needs from the node.
#[derive(Clone, Debug)]
pub struct BusRunner {
    /// A command running longer than this is killed.
    pub command_timeout: Duration,
}

/// Claims `key` (a tick of `schedule` at `bucket`) on the bus and, if this
/// node wins, runs the schedule's command here; then releases on both
/// stores.
pub async fn run_bus_tick(
    gate: Gate,
    journal: Journal,
    runner: BusRunner,
    schedule: Schedule,
    bucket: u64,
    key: String,
) {
    let name = schedule.spec.name.clone();
    match gate.bus_claim(&key).await {
        Ok(Outcome::Won) => {
            tracing::info!(
                event = "lease.acquire",
                path = "bus",
                node = gate.node_id(),
                schedule = %name,
                bucket,
                key = %key,
                "won the bus claim; running the command here"
            );
            let Some(script) = schedule.spec.template.command.clone() else {
                return;
            };
            let env = vec![
                ("LEASEHOLD_SCHEDULE".to_string(), name.clone()),
                ("LEASEHOLD_BUCKET".to_string(), bucket.to_string()),
                ("LEASEHOLD_CLAIM_PATH".to_string(), "bus".to_string()),
                ("LEASEHOLD_NODE_ID".to_string(), gate.node_id().to_string()),
            ];
            let command = CommandLine {
                argv: vec!["sh".to_string(), "-c".to_string(), script],
                env,
                timeout: Some(runner.command_timeout),
            };
            let run = exec::run(&command, Vec::new()).await;
            tracing::info!(
                event = "cron.fire",
                path = "bus",
                schedule = %name,
                bucket,
                outcome = ?run.outcome,
                stdout = %run.stdout.trim_end(),
                stderr = %run.stderr.trim_end(),
                "bus tick ran"
            );
        }
        Ok(Outcome::Lost { winner }) => {
            tracing::info!(
                event = "lease.contend",
                path = "bus",
                schedule = %name,
                bucket,
                winner = winner.unwrap_or(0),
                "another node won the bus claim"
            );
        }
        Err(error) => {
            tracing::warn!(path = "bus", schedule = %name, bucket, %error, "bus claim failed");
        }
    }
    release(&gate, &journal, &key).await;
}

/// Releases `key` on both stores; each is a no-op when it holds nothing.
pub async fn release(gate: &Gate, journal: &Journal, key: &str) {
    if let Err(error) = gate.bus_release(key).await {
        tracing::warn!(%error, key, "bus release failed");
    }
    let worker = format!("node-{}", gate.node_id());
    let held = journal.read_stale(|state| state.leases_held_by(&worker, Some(key)));
    for (job_id, token) in held {
        match journal.propose(Command::Release { job_id, token }).await {
            Ok(_) => tracing::info!(
                event = "lease.release",
                path = "journal",
                job = job_id,
                key,
                "released"
            ),
            Err(error) => tracing::warn!(job = job_id, %error, "journal release failed"),
        }
    }
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

        std::fs::write(&file, "short")?;
        config.cluster_secret_file = Some(file);
        let refused = resolve_secret(&config).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("cluster_secret_file"), "{refused}");
        Ok(())
    }
}
