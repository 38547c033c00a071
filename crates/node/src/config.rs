//! Node configuration: defaults pinned by the spec, a TOML file, and
//! overrides from flags and `LEASEHOLD_*` environment variables (applied by
//! the CLI, which owns argument parsing).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A secret as written in the configuration. Its `Debug` never prints it,
/// so a logged or printed [`Config`] does not leak the cluster secret.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretText(pub String);

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretText(<redacted>)")
    }
}

/// Most async runtime threads a node may be given: far beyond any core
/// count it could use, low enough that a typo cannot exhaust the process's
/// thread limit.
pub const MAX_RUNTIME_THREADS: usize = 1024;
/// The longest a timeout or interval setting may be: a day, in ms.
pub const MAX_INTERVAL_MS: u64 = 86_400_000;

/// Everything a node needs to start. Field names are the TOML keys.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// This node's id in the Raft group (>= 1).
    pub id: u64,
    /// gRPC listen address (public API and peer traffic).
    pub grpc: String,
    /// HTTP listen address (`/livez`, `/readyz`).
    pub http: String,
    /// Data directory (sled).
    pub data: PathBuf,
    /// The gRPC address other nodes reach this one at; defaults to the bound
    /// gRPC address.
    pub advertise: Option<String>,
    /// Any member's gRPC address to join instead of bootstrapping.
    pub join: Option<String>,
    /// Largest job payload accepted (bytes; at most 256 KiB).
    pub max_payload_bytes: usize,
    /// How long a write or linearizable read waits for a quorum.
    pub quorum_timeout_ms: u64,
    /// How often the leader checks for lapsed leases.
    pub sweep_interval_ms: u64,
    /// How often the leader checks for tombstones past retention.
    pub purge_interval_ms: u64,
    /// Raft heartbeat interval.
    pub heartbeat_ms: u64,
    /// Lower bound of the randomized election timeout.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomized election timeout.
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many log entries since the last one.
    pub snapshot_every_entries: u64,
    /// Most batched log entries this node's journal keeps in flight at once
    /// (see docs/architecture.md, "A write, end to end").
    pub batches_in_flight: usize,
    /// A leader sends each batch to its followers as its own log sync
    /// starts, so their syncs overlap (see `leasehold_raft::ahead`); off,
    /// only openraft's replication sends it, after the leader's sync.
    pub replicate_ahead: bool,
    /// Worker threads of the node's async runtime, which `leasehold serve`
    /// builds before the node starts; unset, one per CPU core. Lower it
    /// where several nodes share a machine's cores (docs/deployment.md,
    /// "Nodes that share a machine").
    pub runtime_threads: Option<usize>,
    /// Expose the Faults service (clock skew, store faults). Tests only.
    pub fault_injection: bool,
    /// Start with the clock skewed by this much (fault injection only; a
    /// test's stand-in for "the cluster was down this long").
    pub clock_offset_ms: i64,
    /// This node's tags: schedules with `target = each` address nodes by them,
    /// and the built-in executor claims with them.
    pub tags: Vec<String>,
    /// Run command jobs on this node (the built-in executor).
    pub executor: bool,
    /// Queues the built-in executor takes command jobs from.
    pub executor_queues: Vec<String>,
    /// Commands the executor runs at once, per queue.
    pub executor_concurrency: usize,
    /// A command running longer than this is killed and nacked.
    pub executor_timeout_ms: u64,
    /// How long running commands may finish when the node stops.
    pub drain_grace_ms: u64,
    /// The cluster secret that authenticates adverts and bus messages
    /// (`LEASEHOLD_CLUSTER_SECRET`); every node of a cluster needs the same.
    /// Without it (and without `cluster_secret_file`) a node generates one:
    /// fine for a dev cluster, whose nodes receive it when they join.
    pub cluster_secret: Option<SecretText>,
    /// A file holding the cluster secret (surrounding whitespace ignored).
    pub cluster_secret_file: Option<PathBuf>,
    /// How often this node sends its advert to every peer; a peer is online
    /// while its last advert is younger than three intervals.
    pub advert_interval_ms: u64,
    /// An advert older than this is too old to count: the pool stays on the
    /// bus until that peer is heard again or removed.
    pub advert_stale_after_ms: u64,
    /// Use the journal lease for claims when every peer can (the gate flag;
    /// changeable at run time with `leasehold cluster flags`).
    pub journal_lease: bool,
    /// Stay on the bus but log the claims the journal would have taken.
    pub journal_lease_dry_run: bool,
    /// How long a bus claimant collects answers before judging its claim.
    pub bus_window_ms: u64,
    /// The enforced clock bound: a node whose clock is more than this off
    /// a majority of the voters neither leads, stamps time nor reports
    /// ready, and a new leader honours earlier terms' leases this much past
    /// their expiry (docs/safety.md).
    pub max_clock_offset_ms: u64,
    /// The cluster's CA certificate(s), PEM. With `tls_cert` and `tls_key`
    /// it turns on mutual TLS on the gRPC port and towards peers.
    pub tls_ca: Option<PathBuf>,
    /// This node's certificate, PEM; it must name `leasehold://node/ID`.
    pub tls_cert: Option<PathBuf>,
    /// This node's private key, PEM.
    pub tls_key: Option<PathBuf>,
    /// Client tokens and their roles (hashes only); without it every client
    /// that reaches the port may call anything but the internal services.
    pub tokens_file: Option<PathBuf>,
    /// Listen beyond loopback without TLS and tokens (warned about every
    /// minute). Never for a real fleet.
    pub insecure: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            id: 1,
            grpc: "127.0.0.1:7070".to_string(),
            http: "127.0.0.1:7080".to_string(),
            data: PathBuf::from("./leasehold-data"),
            advertise: None,
            join: None,
            max_payload_bytes: leasehold_core::Limits::default().max_payload_bytes,
            quorum_timeout_ms: 5_000,
            sweep_interval_ms: 1_000,
            purge_interval_ms: 60_000,
            heartbeat_ms: 150,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 600,
            snapshot_every_entries: 10_000,
            batches_in_flight: leasehold_replica::journal::DEFAULT_BATCHES_IN_FLIGHT,
            // Safe since a restarted node no longer leads its old term
            // (docs/decisions.md, "Replication ahead").
            replicate_ahead: true,
            runtime_threads: None,
            fault_injection: false,
            clock_offset_ms: 0,
            tags: Vec::new(),
            executor: true,
            executor_queues: vec![leasehold_core::schedule::DEFAULT_COMMAND_QUEUE.to_string()],
            executor_concurrency: 4,
            executor_timeout_ms: 3_600_000,
            drain_grace_ms: 30_000,
            cluster_secret: None,
            cluster_secret_file: None,
            advert_interval_ms: 1_000,
            advert_stale_after_ms: 30_000,
            journal_lease: true,
            journal_lease_dry_run: false,
            bus_window_ms: 200,
            max_clock_offset_ms: 500,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            tokens_file: None,
            insecure: false,
        }
    }
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parse error (names the key).
        source: Box<toml::de::Error>,
    },
    /// A value is out of range.
    #[error("config {field}: {problem}")]
    Invalid {
        /// The key.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
}

impl Config {
    /// Reads a TOML file; keys it does not set keep their defaults.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source: Box::new(source),
        })
    }

    /// Checks ranges the node relies on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, problem: &str| {
            Err(ConfigError::Invalid { field, problem: problem.to_string() })
        };
        if self.id == 0 {
            return invalid("id", "must be at least 1");
        }
        let limit = leasehold_core::Limits::default().max_payload_bytes;
        if self.max_payload_bytes == 0 || self.max_payload_bytes > limit {
            return invalid("max_payload_bytes", &format!("must be 1 ..= {limit}"));
        }
        // The tags are registered in the journal, which refuses what a
        // job's tags may not be; and `node:ID` is every node's own (its
        // executor claims the `target = each` jobs of its id with it).
        let limits = leasehold_core::Limits::default();
        if let Err(error) = leasehold_core::validate::tags("tags", &self.tags, &limits) {
            return invalid("tags", &format!("{}: {}", error.field, error.problem));
        }
        let prefix = leasehold_core::schedule::NODE_TAG_PREFIX;
        if let Some(tag) = self.tags.iter().find(|tag| tag.starts_with(prefix)) {
            return invalid(
                "tags",
                &format!("{tag:?}: tags beginning {prefix:?} name nodes and are the node's own"),
            );
        }
        // An election timeout within a few heartbeats elects on any jitter.
        if self.heartbeat_ms == 0
            || self.election_timeout_min_ms < self.heartbeat_ms.saturating_mul(2)
        {
            return invalid("election_timeout_min_ms", "must be at least twice heartbeat_ms");
        }
        if self.election_timeout_max_ms <= self.election_timeout_min_ms {
            return invalid("election_timeout_max_ms", "must exceed election_timeout_min_ms");
        }
        // Each is added to a clock reading: beyond a day is a typo, and
        // near u64::MAX it would overflow the instant it is added to.
        for (field, value) in [
            ("quorum_timeout_ms", self.quorum_timeout_ms),
            ("sweep_interval_ms", self.sweep_interval_ms),
            ("purge_interval_ms", self.purge_interval_ms),
        ] {
            if value == 0 || value > MAX_INTERVAL_MS {
                return invalid(field, &format!("must be 1 ..= {MAX_INTERVAL_MS} (a day)"));
            }
        }
        for (index, queue) in self.executor_queues.iter().enumerate() {
            if leasehold_core::validate::queue_name("executor_queues", queue).is_err() {
                return Err(ConfigError::Invalid {
                    field: "executor_queues",
                    problem: format!("entry {index} ({queue:?}) is not a valid queue name"),
                });
            }
            // Enqueueing on a command queue needs the admin role; an
            // executor on any other queue would run what a producer sent.
            if !leasehold_core::schedule::is_command_queue(queue) {
                return Err(ConfigError::Invalid {
                    field: "executor_queues",
                    problem: format!(
                        "entry {index} ({queue:?}) is not a command queue: the executor runs \
                         only exec or exec.NAME, which only admin tokens may fill"
                    ),
                });
            }
        }
        if self.executor_concurrency == 0 {
            return invalid("executor_concurrency", "must be positive");
        }
        if self.executor_timeout_ms == 0 || self.executor_timeout_ms > MAX_INTERVAL_MS {
            return invalid(
                "executor_timeout_ms",
                &format!("must be 1 ..= {MAX_INTERVAL_MS} (a day)"),
            );
        }
        if self.clock_offset_ms != 0 && !self.fault_injection {
            return invalid("clock_offset_ms", "needs fault_injection = true");
        }
        if self.snapshot_every_entries == 0 {
            return invalid("snapshot_every_entries", "must be at least 1");
        }
        if !(1..=16).contains(&self.batches_in_flight) {
            return invalid("batches_in_flight", "must be 1 ..= 16");
        }
        if let Some(threads) = self.runtime_threads
            && !(1..=MAX_RUNTIME_THREADS).contains(&threads)
        {
            return invalid(
                "runtime_threads",
                &format!("must be 1 ..= {MAX_RUNTIME_THREADS} (or unset: one per core)"),
            );
        }
        if self.advert_interval_ms == 0 || self.advert_interval_ms > 60_000 {
            return invalid("advert_interval_ms", "must be 1 ..= 60000");
        }
        if self.advert_stale_after_ms <= self.advert_interval_ms.saturating_mul(3) {
            return invalid(
                "advert_stale_after_ms",
                "must exceed three advert intervals (the online window)",
            );
        }
        if self.bus_window_ms == 0 || self.bus_window_ms > 5_000 {
            return invalid("bus_window_ms", "must be 1 ..= 5000");
        }
        if self.max_clock_offset_ms == 0
            || self.max_clock_offset_ms > leasehold_core::command::MAX_CLOCK_OFFSET_MS
        {
            return invalid(
                "max_clock_offset_ms",
                &format!("must be 1 ..= {}", leasehold_core::command::MAX_CLOCK_OFFSET_MS),
            );
        }
        // Two secrets would leave which one the node uses to a rule the
        // operator may not know: a node that took the other one would
        // refuse its peers' adverts (or they its).
        if self.cluster_secret.is_some() && self.cluster_secret_file.is_some() {
            return invalid(
                "cluster_secret_file",
                "given with cluster_secret (LEASEHOLD_CLUSTER_SECRET); give one of the two",
            );
        }
        if let Some(SecretText(secret)) = &self.cluster_secret
            && let Err(error) = leasehold_security::ClusterSecret::from_text(secret)
        {
            return invalid("cluster_secret", &error.to_string());
        }
        let tls_set = [&self.tls_ca, &self.tls_cert, &self.tls_key].map(Option::is_some);
        if tls_set.iter().any(|set| *set) && !tls_set.iter().all(|set| *set) {
            return invalid(
                "tls_ca",
                "--tls-ca, --tls-cert and --tls-key go together: give all three or none",
            );
        }
        self.check_exposure()?;
        self.check_advertise()
    }

    /// The address peers are told to reach this node at must be one they
    /// can dial: a wildcard (`0.0.0.0`, `[::]`) names every host's own
    /// port, so a node listening on one needs `advertise`.
    fn check_advertise(&self) -> Result<(), ConfigError> {
        let (field, addr) = match &self.advertise {
            Some(advertise) => ("advertise", advertise.as_str()),
            None => ("grpc", self.grpc.as_str()),
        };
        let host_port = addr.split_once("://").map_or(addr, |(_, rest)| rest);
        let host_port = host_port.strip_suffix('/').unwrap_or(host_port);
        let wildcard = match host_port.parse::<std::net::SocketAddr>() {
            Ok(socket) => socket.ip().is_unspecified(),
            Err(_) => false,
        };
        if !wildcard {
            return Ok(());
        }
        let problem = match field {
            "grpc" => format!(
                "{addr} listens on every interface, and peers cannot dial it: set --advertise \
                 (LEASEHOLD_ADVERTISE, `advertise`) to the address they reach this node at"
            ),
            _ => format!("{addr} is not an address peers can dial; give the one they reach"),
        };
        Err(ConfigError::Invalid { field: "advertise", problem })
    }

    /// The TLS files, when TLS is on.
    pub fn tls_files(&self) -> Option<leasehold_security::TlsFiles> {
        match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (Some(ca), Some(cert), Some(key)) => Some(leasehold_security::TlsFiles {
                ca: ca.clone(),
                cert: cert.clone(),
                key: key.clone(),
            }),
            _ => None,
        }
    }

    /// Whether the gRPC listen address is reachable only from this machine.
    pub fn grpc_is_loopback(&self) -> bool {
        is_loopback(&self.grpc)
    }

    /// The ports other machines can reach without what they need (gRPC:
    /// TLS and tokens; HTTP: tokens), each with what it lacks: what
    /// `--insecure` lets the node start with, and what it then warns of.
    pub fn unprotected_ports(&self) -> Vec<String> {
        let mut ports = Vec::new();
        if !self.grpc_is_loopback() {
            let lacks = match (self.tls_files().is_none(), self.tokens_file.is_none()) {
                (true, true) => Some("TLS and tokens"),
                (true, false) => Some("TLS"),
                (false, true) => Some("tokens"),
                (false, false) => None,
            };
            if let Some(lacks) = lacks {
                ports.push(format!("gRPC {} without {lacks}", self.grpc));
            }
        }
        if !is_loopback(&self.http) && self.tokens_file.is_none() {
            ports.push(format!("HTTP {} without tokens (the status page)", self.http));
        }
        ports
    }

    /// Safe by default: a gRPC port other machines can reach needs TLS and
    /// tokens, and an HTTP port they can reach needs tokens (the status
    /// page's), unless `insecure` says the operator knows better.
    fn check_exposure(&self) -> Result<(), ConfigError> {
        if self.insecure {
            return Ok(());
        }
        if !is_loopback(&self.http) && self.tokens_file.is_none() {
            return Err(ConfigError::Invalid {
                field: "http",
                problem: format!(
                    "{} is not a loopback address, so other machines can reach it; without \
                     --tokens the status page there (/api/status) shows the cluster (addresses, \
                     queues, lease holders, the last errors of jobs) to anyone who does. Give \
                     --tokens (the page then asks for a reader token; /livez, /readyz and \
                     /metrics stay open to probes), keep --http on loopback, or --insecure",
                    self.http
                ),
            });
        }
        if self.grpc_is_loopback() {
            return Ok(());
        }
        let mut missing = Vec::new();
        if self.tls_files().is_none() {
            missing.push("--tls-ca, --tls-cert and --tls-key (mutual TLS)");
        }
        if self.tokens_file.is_none() {
            missing.push("--tokens (client tokens and roles)");
        }
        if missing.is_empty() {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            field: "grpc",
            problem: format!(
                "{} is not a loopback address, so other machines can reach it; a node listening \
                 there needs {} (or --insecure to run without them, which lets anyone who reaches \
                 the port run commands on the fleet). `leasehold dev-certs DIR` writes a CA, \
                 certificates and tokens to try it with",
                self.grpc,
                missing.join(" and ")
            ),
        })
    }

    /// The quorum timeout as a duration.
    pub fn quorum_timeout(&self) -> Duration {
        Duration::from_millis(self.quorum_timeout_ms)
    }
}

/// Whether `addr` (`host:port`) names only this machine: a loopback IP
/// (127.0.0.0/8, ::1) or `localhost`. Anything else, a host name included,
/// may be reachable from elsewhere.
pub fn is_loopback(addr: &str) -> bool {
    if let Ok(socket) = addr.parse::<std::net::SocketAddr>() {
        return socket.ip().is_loopback();
    }
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.eq_ignore_ascii_case("localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_pinned_conventions() {
        let config = Config::default();
        assert_eq!(config.id, 1);
        assert_eq!(config.grpc, "127.0.0.1:7070");
        assert_eq!(config.http, "127.0.0.1:7080");
        assert_eq!(config.data, PathBuf::from("./leasehold-data"));
        assert!(config.validate().is_ok());
    }

    #[test]
    fn file_overrides_some_keys_and_rejects_unknown_ones() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("node.toml");
        std::fs::write(&path, "id = 3\ngrpc = \"127.0.0.1:9000\"\n")?;
        let config = Config::from_file(&path)?;
        assert_eq!(config.id, 3);
        assert_eq!(config.grpc, "127.0.0.1:9000");
        assert_eq!(config.http, "127.0.0.1:7080");

        std::fs::write(&path, "idd = 3\n")?;
        let error = Config::from_file(&path).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("idd"), "{error}");
        Ok(())
    }

    #[test]
    fn tags_and_raft_timing_are_checked_before_the_node_starts() {
        let refused = |config: Config| config.validate().err().map(|e| e.to_string());
        for tags in [
            vec![String::new()],
            vec!["gpu".to_string(), String::new()],
            vec!["t".repeat(257)],
            vec!["t".to_string(); 33],
            vec!["node:3".to_string()],
        ] {
            let error = refused(Config { tags: tags.clone(), ..Config::default() });
            assert!(error.as_deref().is_some_and(|e| e.contains("tags")), "{tags:?}: {error:?}");
        }
        let fine = Config { tags: vec!["gpu".into(), "eu-west".into()], ..Config::default() };
        assert_eq!(fine.validate().err().map(|e| e.to_string()), None);
        let tight = Config { heartbeat_ms: 150, election_timeout_min_ms: 151, ..Config::default() };
        let error = refused(tight);
        assert!(error.as_deref().is_some_and(|e| e.contains("heartbeat_ms")), "{error:?}");
    }

    #[test]
    fn gate_settings_are_checked_by_name() {
        let refused = |config: Config| config.validate().err().map(|e| e.to_string());
        let error = refused(Config { advert_interval_ms: 0, ..Config::default() });
        assert!(error.as_deref().is_some_and(|e| e.contains("advert_interval_ms")), "{error:?}");
        let error = refused(Config { advert_stale_after_ms: 3_000, ..Config::default() });
        assert!(error.as_deref().is_some_and(|e| e.contains("advert_stale_after_ms")), "{error:?}");
        let error = refused(Config { bus_window_ms: 0, ..Config::default() });
        assert!(error.as_deref().is_some_and(|e| e.contains("bus_window_ms")), "{error:?}");
        let short = SecretText("short".into());
        let error = refused(Config { cluster_secret: Some(short), ..Config::default() });
        assert!(error.as_deref().is_some_and(|e| e.contains("cluster_secret")), "{error:?}");
        let both = Config {
            cluster_secret: Some(SecretText("a cluster secret given inline".into())),
            cluster_secret_file: Some("secret".into()),
            ..Config::default()
        };
        let error = refused(both);
        assert!(error.as_deref().is_some_and(|e| e.contains("cluster_secret_file")), "{error:?}");
        let secret = SecretText("a secret that must never be printed".into());
        let config = Config { cluster_secret: Some(secret), ..Config::default() };
        let printed = format!("{config:?}");
        assert!(!printed.contains("never be printed"), "{printed}");
        let config = Config::default();
        assert!(
            config.journal_lease && !config.journal_lease_dry_run,
            "fresh nodes use the journal"
        );
    }

    #[test]
    fn a_port_other_machines_can_reach_needs_tls_and_tokens_or_insecure() {
        let exposed = Config { grpc: "0.0.0.0:7070".into(), ..Config::default() };
        let error = exposed.validate().err().map(|e| e.to_string()).unwrap_or_default();
        for named in [
            "grpc",
            "0.0.0.0:7070",
            "--tls-ca",
            "--tls-cert",
            "--tls-key",
            "--tokens",
            "--insecure",
        ] {
            assert!(error.contains(named), "{named}: {error}");
        }
        let tls_only = Config {
            tls_ca: Some("ca.pem".into()),
            tls_cert: Some("node-1.pem".into()),
            tls_key: Some("node-1.key".into()),
            ..exposed.clone()
        };
        let error = tls_only.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("--tokens") && !error.contains("--tls-cert"), "{error}");
        let secure = Config {
            tokens_file: Some("tokens.toml".into()),
            advertise: Some("node-1.example:7070".into()),
            ..tls_only
        };
        assert!(secure.validate().is_ok());
        let advertised = Some("10.1.2.3:7070".to_string());
        assert!(
            Config { insecure: true, advertise: advertised, ..exposed.clone() }.validate().is_ok()
        );
        // Listening everywhere, a node must say where peers reach it.
        for (listen, advertise) in [
            ("0.0.0.0:7070", None),
            ("[::]:7070", None),
            ("0.0.0.0:7070", Some("0.0.0.0:7070")),
            ("10.1.2.3:7070", Some("http://[::]:7070")),
        ] {
            let config = Config {
                grpc: listen.into(),
                advertise: advertise.map(String::from),
                insecure: true,
                ..Config::default()
            };
            let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("advertise"), "{listen} {advertise:?}: {error}");
        }
        for loopback in ["127.0.0.1:7070", "127.0.0.5:9", "[::1]:7070", "localhost:7070"] {
            assert!(is_loopback(loopback), "{loopback}");
            assert!(Config { grpc: loopback.into(), ..Config::default() }.validate().is_ok());
        }
        for reachable in ["0.0.0.0:7070", "[::]:7070", "10.1.2.3:7070", "node1.example:7070"] {
            assert!(!is_loopback(reachable), "{reachable}");
        }
        let http = Config { http: "0.0.0.0:7080".into(), ..Config::default() };
        let error = http.validate().err().map(|e| e.to_string()).unwrap_or_default();
        for named in ["http", "0.0.0.0:7080", "--tokens", "/api/status", "--insecure"] {
            assert!(error.contains(named), "{named}: {error}");
        }
        let with_tokens = Config { tokens_file: Some("tokens.toml".into()), ..http.clone() };
        assert!(with_tokens.validate().is_ok(), "tokens are enough for the HTTP port");
        assert!(Config { insecure: true, ..http.clone() }.validate().is_ok());
        // What --insecure then warns of: the HTTP port alone, named.
        let ports = Config { insecure: true, ..http }.unprotected_ports();
        assert!(ports.len() == 1 && ports[0].contains("HTTP 0.0.0.0:7080"), "{ports:?}");
        assert!(Config::default().unprotected_ports().is_empty(), "loopback needs nothing");
        let partial = Config { tls_ca: Some("ca.pem".into()), ..Config::default() };
        let error = partial.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("all three"), "{error}");
    }

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        let config = Config { id: 0, ..Config::default() };
        let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("id"), "{error}");
        let config = Config { max_payload_bytes: 1 << 30, ..Config::default() };
        let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("max_payload_bytes"), "{error}");
        for batches_in_flight in [0, 17] {
            let config = Config { batches_in_flight, ..Config::default() };
            let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("batches_in_flight"), "{batches_in_flight}: {error}");
        }
        assert!(Config { batches_in_flight: 16, ..Config::default() }.validate().is_ok());
        for runtime_threads in [0, MAX_RUNTIME_THREADS + 1] {
            let config = Config { runtime_threads: Some(runtime_threads), ..Config::default() };
            let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("runtime_threads"), "{runtime_threads}: {error}");
        }
        for runtime_threads in [None, Some(1), Some(MAX_RUNTIME_THREADS)] {
            assert!(Config { runtime_threads, ..Config::default() }.validate().is_ok());
        }
        type Zeroes = fn(&mut Config);
        let zero: [(&str, Zeroes); 5] = [
            ("quorum_timeout_ms", |c| c.quorum_timeout_ms = 0),
            ("sweep_interval_ms", |c| c.sweep_interval_ms = 0),
            ("purge_interval_ms", |c| c.purge_interval_ms = 0),
            ("executor_concurrency", |c| c.executor_concurrency = 0),
            ("executor_timeout_ms", |c| c.executor_timeout_ms = 0),
        ];
        for (field, set) in zero {
            let mut config = Config::default();
            set(&mut config);
            let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains(&format!("config {field}:")), "{field}: {error}");
        }
        let huge: [(&str, Zeroes); 4] = [
            ("quorum_timeout_ms", |c| c.quorum_timeout_ms = u64::MAX),
            ("sweep_interval_ms", |c| c.sweep_interval_ms = MAX_INTERVAL_MS + 1),
            ("purge_interval_ms", |c| c.purge_interval_ms = u64::MAX),
            ("executor_timeout_ms", |c| c.executor_timeout_ms = u64::MAX),
        ];
        for (field, set) in huge {
            let mut config = Config::default();
            set(&mut config);
            let error = config.validate().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains(&format!("config {field}:")), "{field}: {error}");
        }
        let day = Config { quorum_timeout_ms: MAX_INTERVAL_MS, ..Config::default() };
        assert!(day.validate().is_ok());
    }
}
