//! `leasehold serve`: configuration from file, environment and flags (in
//! rising precedence), logging, and the node's life until a signal.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use leasehold_node::{Config, Node, Transport};

/// Flags of `leasehold serve`; each also reads `LEASEHOLD_<NAME>`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Node id (>= 1).
    #[arg(long, env = "LEASEHOLD_ID")]
    id: Option<u64>,
    /// gRPC listen address.
    #[arg(long, env = "LEASEHOLD_GRPC")]
    grpc: Option<String>,
    /// HTTP listen address (/livez, /readyz).
    #[arg(long, env = "LEASEHOLD_HTTP")]
    http: Option<String>,
    /// Data directory.
    #[arg(long, env = "LEASEHOLD_DATA")]
    data: Option<PathBuf>,
    /// Address peers reach this node at (default: the gRPC address).
    #[arg(long, env = "LEASEHOLD_ADVERTISE")]
    advertise: Option<String>,
    /// Any member's gRPC address, to join its cluster.
    #[arg(long, env = "LEASEHOLD_JOIN")]
    join: Option<String>,
    /// TOML configuration file.
    #[arg(long, env = "LEASEHOLD_CONFIG")]
    config: Option<PathBuf>,
    /// This node's tags (repeatable).
    #[arg(long = "tag", env = "LEASEHOLD_TAGS", value_delimiter = ',')]
    tags: Vec<String>,
    /// Do not run command jobs on this node (`--no-executor false` runs
    /// them whatever the config file says).
    #[arg(long, env = "LEASEHOLD_NO_EXECUTOR", num_args = 0..=1, default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new())]
    no_executor: Option<bool>,
    /// Expose the Faults service (clock skew, store faults) for tests.
    #[arg(long, env = "LEASEHOLD_FAULT_INJECTION", hide = true, num_args = 0..=1,
        default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    fault_injection: Option<bool>,
    /// The cluster secret authenticating adverts and bus claims (prefer the
    /// environment variable or a file: a flag shows in the process list).
    #[arg(long, env = "LEASEHOLD_CLUSTER_SECRET", hide_env_values = true)]
    cluster_secret: Option<String>,
    /// A file holding the cluster secret.
    #[arg(long, env = "LEASEHOLD_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// The journal_lease gate flag at start (default on).
    #[arg(long, env = "LEASEHOLD_JOURNAL_LEASE", value_parser = on_off)]
    journal_lease: Option<bool>,
    /// The journal_lease dry-run flag at start (default off).
    #[arg(long, env = "LEASEHOLD_JOURNAL_LEASE_DRY_RUN", value_parser = on_off)]
    journal_lease_dry_run: Option<bool>,
    /// The cluster's CA certificate (PEM); with --tls-cert and --tls-key,
    /// mutual TLS on the gRPC port and towards peers.
    #[arg(long, env = "LEASEHOLD_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// This node's certificate (PEM), naming leasehold://node/ID.
    #[arg(long, env = "LEASEHOLD_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// This node's private key (PEM).
    #[arg(long, env = "LEASEHOLD_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// Client tokens and roles (TOML of token hashes); re-read on SIGHUP.
    #[arg(long = "tokens", env = "LEASEHOLD_TOKENS")]
    tokens_file: Option<PathBuf>,
    /// Listen beyond loopback without TLS and tokens. Anyone who reaches
    /// the port can then run commands on the fleet; never for a real fleet.
    #[arg(long, env = "LEASEHOLD_INSECURE", num_args = 0..=1, default_missing_value = "true",
        value_parser = crate::boolish_or_empty)]
    insecure: Option<bool>,
    /// Worker threads of the node's async runtime (default: one per core);
    /// lower it where several nodes share a machine's cores.
    #[arg(long, env = "LEASEHOLD_RUNTIME_THREADS")]
    runtime_threads: Option<usize>,
    /// Log format.
    #[arg(long, env = "LEASEHOLD_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

/// A `serve` invocation resolved before its runtime starts, since the
/// configuration says how many threads that runtime gets.
pub struct Prepared {
    config: Config,
    log_format: LogFormat,
}

impl Prepared {
    /// Worker threads the runtime should have; `None` for one per core.
    pub fn runtime_threads(&self) -> Option<usize> {
        self.config.runtime_threads
    }
}

/// Reads the configuration a `serve` invocation means (file, environment,
/// flags) and checks it, without starting anything.
pub fn prepare(args: &ServeArgs) -> anyhow::Result<Prepared> {
    Ok(Prepared { config: resolve(args)?, log_format: args.log_format })
}

/// Parses `on`/`off` (also `true`/`false`, `1`/`0`).
pub fn on_off(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        other => Err(format!("expected on or off, got {other:?}")),
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// What a node logs when `LEASEHOLD_LOG` is unset: its own events at info,
/// the libraries under it only when something is wrong. openraft reports
/// election steps at info; raft-log reports every flush (about one line a
/// write under load), which would bury the events an operator reads
/// (docs/operations.md, "Events") and cost CPU on the log's flush thread.
const DEFAULT_LOG_FILTER: &str = "info,openraft=warn,raft_log=warn,chunked_wal=warn";

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The configuration a `serve` invocation means.
fn resolve(args: &ServeArgs) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    if let Some(id) = args.id {
        config.id = id;
    }
    if let Some(grpc) = &args.grpc {
        config.grpc = grpc.clone();
    }
    if let Some(http) = &args.http {
        config.http = http.clone();
    }
    if let Some(data) = &args.data {
        config.data = data.clone();
    }
    if let Some(advertise) = &args.advertise {
        config.advertise = Some(advertise.clone());
    }
    if let Some(join) = &args.join {
        config.join = Some(join.clone());
    }
    if !args.tags.is_empty() {
        config.tags = args.tags.clone();
    }
    // Given (a flag, or its variable), each replaces the config file's
    // value either way; `--insecure false` turns off what the file set.
    if let Some(no_executor) = args.no_executor {
        config.executor = !no_executor;
    }
    if let Some(on) = args.fault_injection {
        config.fault_injection = on;
    }
    // A secret given by flag or environment replaces the config file's,
    // whichever of the two ways the file gave it; given both ways here,
    // validation refuses the pair rather than pick one.
    if args.cluster_secret.is_some() || args.cluster_secret_file.is_some() {
        config.cluster_secret = args.cluster_secret.clone().map(leasehold_node::config::SecretText);
        config.cluster_secret_file = args.cluster_secret_file.clone();
    }
    if let Some(on) = args.journal_lease {
        config.journal_lease = on;
    }
    if let Some(on) = args.journal_lease_dry_run {
        config.journal_lease_dry_run = on;
    }
    for (flag, value) in [
        (&mut config.tls_ca, &args.tls_ca),
        (&mut config.tls_cert, &args.tls_cert),
        (&mut config.tls_key, &args.tls_key),
        (&mut config.tokens_file, &args.tokens_file),
    ] {
        if let Some(path) = value {
            *flag = Some(path.clone());
        }
    }
    if let Some(on) = args.insecure {
        config.insecure = on;
    }
    if let Some(threads) = args.runtime_threads {
        config.runtime_threads = Some(threads);
    }
    config.validate()?;
    Ok(config)
}

/// Runs a node until SIGTERM or Ctrl-C.
pub async fn run(prepared: Prepared) -> anyhow::Result<ExitCode> {
    let Prepared { config, log_format } = prepared;
    init_logging(log_format);
    // Before the node starts: it answers calls while it starts, so a
    // supervisor that saw it up may signal it before start returns, and a
    // signal without a handler would end it at once, undrained.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    // One stream for the node's whole life, as for SIGTERM: it keeps a
    // signal that arrives while nothing waits on it (during a reload, or
    // between the join and the drain loop) for the next wait, where a
    // `ctrl_c()` future made anew for each wait would miss it.
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("installing the SIGINT handler")?;
    let transport = Transport::bind(&config).await?;
    // A join may wait minutes for a member that does not answer; a signal
    // then stops it (the node is not a member yet: nothing to drain).
    let stop = async {
        tokio::select! {
            _ = terminate.recv() => tracing::warn!("SIGTERM while joining: stopping"),
            _ = interrupt.recv() => tracing::warn!("interrupt while joining: stopping"),
        }
    };
    let node = Node::start_until(config, transport, stop).await.context("starting the node")?;
    {
        // A node whose stdout is closed or full runs on: this line is for
        // whoever started it, and a panic here would skip the drain.
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(
            stdout,
            "leasehold node listening: grpc {} http {}",
            node.grpc_addr(),
            node.http_addr()
        )
        .and_then(|()| stdout.flush());
    }
    let mut drain_requested = node.journal().drain_requested();
    loop {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: draining"),
            _ = interrupt.recv() => tracing::info!("interrupt: draining"),
            _ = drain_requested.wait_for(|asked| *asked) => tracing::info!("drain requested: draining"),
            _ = hangup.recv() => {
                // Rotation: a kind whose file is bad keeps what it had; the
                // other is in force.
                if let Err(error) = node.reload_credentials() {
                    tracing::error!(event = "auth.reload", %error, "SIGHUP: reload failed for what the error names; that keeps what it had");
                }
                continue;
            }
            why = node.server_stopped() => {
                // A node whose gRPC or HTTP listener failed serves nothing
                // there (or says nothing of its health): exit, as on a
                // storage fault, for a supervisor to restart it.
                tracing::error!(error = %why, "a server stopped; exiting");
                let _ = node.shutdown(std::time::Duration::from_secs(5)).await;
                return Ok(ExitCode::FAILURE);
            }
            fatal = node.raft_failed() => {
                // Fail-stop: a node whose Raft core quit (say, on a full disk)
                // would stay up serving nothing; exiting lets a supervisor
                // restart it on its data dir once the fault is fixed.
                tracing::error!(error = %fatal, "Raft stopped on a fatal error; exiting");
                let _ = node.shutdown(std::time::Duration::from_secs(5)).await;
                return Ok(ExitCode::FAILURE);
            }
        }
        break;
    }
    let drain = node.drain();
    tokio::select! {
        result = drain => result.context("draining")?,
        _ = terminate.recv() => {
            tracing::warn!("second SIGTERM: exiting at once");
            return Ok(ExitCode::FAILURE);
        }
        _ = interrupt.recv() => {
            tracing::warn!("second interrupt: exiting at once");
            return Ok(ExitCode::FAILURE);
        }
    }
    tracing::info!(event = "drain.step", step = "exit", "drained");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn resolved(flags: &[&str]) -> anyhow::Result<Config> {
        let args = Serve::try_parse_from(std::iter::once("serve").chain(flags.iter().copied()))?;
        resolve(&args.args)
    }

    #[test]
    fn a_true_false_flag_given_turns_the_files_setting_off_as_well_as_on() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let on = dir.path().join("on.toml");
        std::fs::write(&on, "insecure = true\nfault_injection = true\nexecutor = false\n")?;
        let on = on.display().to_string();
        let config = resolved(&["--config", &on])?;
        assert!(config.insecure && config.fault_injection && !config.executor, "the file's");
        let config = resolved(&[
            "--config",
            &on,
            "--insecure",
            "false",
            "--fault-injection=false",
            "--no-executor",
            "0",
        ])?;
        assert!(!config.insecure && !config.fault_injection && config.executor, "turned off");
        let config = resolved(&["--insecure", "--no-executor", "--fault-injection"])?;
        assert!(config.insecure && config.fault_injection && !config.executor, "bare flags");
        let config = resolved(&[])?;
        assert!(!config.insecure && !config.fault_injection && config.executor, "defaults");
        Ok(())
    }

    #[test]
    fn a_secret_given_by_flag_replaces_the_config_files_either_way() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let secret_file = dir.path().join("secret");
        std::fs::write(&secret_file, "a cluster secret kept in a file")?;
        let inline = dir.path().join("inline.toml");
        std::fs::write(&inline, "cluster_secret = \"a cluster secret in the config file\"\n")?;
        let by_file = dir.path().join("by-file.toml");
        std::fs::write(&by_file, format!("cluster_secret_file = {:?}\n", secret_file))?;
        let (inline, by_file) = (inline.display().to_string(), by_file.display().to_string());
        let file = secret_file.display().to_string();

        let config = resolved(&["--config", &inline, "--cluster-secret-file", &file])?;
        assert!(config.cluster_secret.is_none(), "the file's inline secret is replaced");
        assert_eq!(config.cluster_secret_file.as_deref(), Some(secret_file.as_path()));

        let config =
            resolved(&["--config", &by_file, "--cluster-secret", "a secret given on the flag"])?;
        assert!(config.cluster_secret_file.is_none(), "the file's secret file is replaced");
        assert!(config.cluster_secret.is_some());

        let config = resolved(&["--config", &by_file])?;
        assert!(config.cluster_secret.is_none() && config.cluster_secret_file.is_some());

        let both = ["--cluster-secret", "a secret given on the flag", "--cluster-secret-file"];
        let refused = resolved(&[&both[..], &[&file]].concat()).err().map(|e| e.to_string());
        assert!(
            refused.as_deref().is_some_and(|e| e.contains("cluster_secret_file")),
            "{refused:?}"
        );
        Ok(())
    }
}
