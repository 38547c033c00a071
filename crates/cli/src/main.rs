//! `leasehold`: `serve` starts a node, `dev-certs` and `completions` write
//! files and scripts, and every other subcommand is a client of a node's
//! gRPC API (`--addr` or `LEASEHOLD_ADDR`).

mod bulk;
mod cluster;
mod cron;
mod dev_certs;
mod job;
mod render;
mod serve;
mod worker;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use leasehold_client::ClientError;

/// mimalloc instead of the system allocator: a node allocates and frees a
/// few small buffers per RPC on every runtime thread, and glibc's malloc
/// and free were about 7% of the CPU samples of a loaded three-node cluster.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Output format of read commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned tables for people.
    #[default]
    Text,
    /// One JSON document.
    Json,
}

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "A fenced, Raft-replicated job scheduler for fleets",
    after_help = "Examples:
  leasehold serve
  leasehold job enqueue --queue emails --payload hi
  leasehold worker --queue emails -- ./send-email.sh
  leasehold cluster status --addr http://10.0.0.11:7070
  source <(leasehold completions bash)"
)]
struct Cli {
    #[command(subcommand)]
    command: Top,
}

#[derive(Subcommand)]
enum Top {
    /// Start a node (with no flags: a single-node cluster on 127.0.0.1:7070).
    #[command(after_help = "Examples:
  leasehold serve
  leasehold serve --id 1 --grpc 10.0.0.11:7070 --http 10.0.0.11:7080 --data /var/lib/leasehold
  leasehold serve --id 2 --grpc 10.0.0.12:7070 --http 10.0.0.12:7080 --data /var/lib/leasehold --join 10.0.0.11:7070
  leasehold serve --config /etc/leasehold/node.toml --tag gpu --tag eu")]
    Serve(serve::ServeArgs),
    /// Enqueue, claim, finish and inspect jobs.
    #[command(after_help = "Examples:
  leasehold job enqueue --queue emails --payload hi
  leasehold job enqueue --file jobs.jsonl
  leasehold job list --queue emails --state dead
  leasehold job stats
  leasehold job redrive --queue emails")]
    Job(job::JobArgs),
    /// Manage cron schedules.
    #[command(after_help = "Examples:
  leasehold cron put nightly-backup --cron '0 3 * * *' --command 'backup.sh'
  leasehold cron list
  leasehold cron history nightly-backup")]
    Cron(cron::CronArgs),
    /// Inspect the cluster.
    #[command(after_help = "Examples:
  leasehold cluster status
  leasehold cluster drain 3
  LEASEHOLD_ADDR=https://10.0.0.11:7070 leasehold cluster status --tls-ca ca.pem --tls-cert client.pem --tls-key client.key")]
    Cluster(cluster::ClusterArgs),
    /// Run a command for each job of a queue, with its lease renewed while it runs.
    #[command(after_help = "Examples:
  leasehold worker --queue emails -- ./send-email.sh
  leasehold worker --queue render --concurrency 4 --tag gpu -- python3 render.py
  LEASEHOLD_ADDR=http://10.0.0.11:7070,http://10.0.0.12:7070 leasehold worker --queue emails -- ./send.sh")]
    Worker(worker::WorkerArgs),
    /// Write a throwaway CA, node and client certificates, and tokens, to
    /// try a secure cluster on one machine.
    #[command(after_help = "Examples:
  leasehold dev-certs certs
  leasehold dev-certs certs --nodes 5 --host node-1.internal --host 10.0.0.11")]
    DevCerts(dev_certs::DevCertsArgs),
    /// Print a shell completion script on stdout.
    #[command(after_help = "Examples:
  source <(leasehold completions bash)
  leasehold completions bash > /etc/bash_completion.d/leasehold
  leasehold completions zsh > \"${fpath[1]}/_leasehold\"
  leasehold completions fish > ~/.config/fish/completions/leasehold.fish")]
    Completions {
        /// The shell to complete for.
        shell: clap_complete::Shell,
    },
}

impl Top {
    /// The addresses a client subcommand dials, for the message when none
    /// answers.
    fn addr(&self) -> Option<&str> {
        match self {
            Top::Job(args) => Some(&args.connection().addr),
            Top::Cron(args) => Some(&args.connection().addr),
            Top::Cluster(args) => Some(&args.connection().addr),
            _ => None,
        }
    }

    /// Whether the subcommand writes: its failure may leave the write
    /// applied, which the error then says.
    fn writes(&self) -> bool {
        match self {
            Top::Job(args) => args.writes(),
            Top::Cron(args) => args.writes(),
            Top::Cluster(args) => args.writes(),
            _ => false,
        }
    }
}

/// How a client subcommand reaches a node and proves who it is.
#[derive(clap::Args, Clone)]
pub struct Connection {
    /// Any node's gRPC address (several, comma-separated, are tried in turn).
    #[arg(long, env = "LEASEHOLD_ADDR", default_value = "http://127.0.0.1:7070", global = true)]
    pub addr: String,
    /// The cluster's CA certificate (PEM); with --tls-cert and --tls-key,
    /// talk TLS (addresses then default to https://).
    #[arg(long, env = "LEASEHOLD_TLS_CA", global = true)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// This client's certificate (PEM), signed by the cluster's CA.
    #[arg(long, env = "LEASEHOLD_TLS_CERT", global = true)]
    pub tls_cert: Option<std::path::PathBuf>,
    /// This client's private key (PEM).
    #[arg(long, env = "LEASEHOLD_TLS_KEY", global = true)]
    pub tls_key: Option<std::path::PathBuf>,
    /// A bearer token with the role the command needs (prefer the
    /// environment variable: a flag shows in the process list).
    #[arg(long, env = "LEASEHOLD_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Send the token without TLS to an address beyond loopback: only for a
    /// node run with --insecure (refused otherwise, as the token would
    /// cross the network unencrypted).
    #[arg(long, env = "LEASEHOLD_INSECURE", global = true, value_parser = boolish_or_empty)]
    pub insecure: bool,
}

/// A yes/no flag's value, empty being no: `LEASEHOLD_INSECURE=` (set but
/// empty, as a shell or a unit file leaves it) means unset, not an error.
pub(crate) fn boolish_or_empty(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "no" | "off" | "n" | "f" => Ok(false),
        "1" | "true" | "yes" | "on" | "y" | "t" => Ok(true),
        _ => Err(format!("{text:?}: expected true or false (1/0, yes/no, on/off)")),
    }
}

/// Everything but the token's value.
impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("addr", &self.addr)
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("token", &self.token.as_ref().map(|_| "(set)"))
            .field("insecure", &self.insecure)
            .finish()
    }
}

impl Connection {
    /// A client for these settings. A variable set but empty
    /// (`LEASEHOLD_TOKEN=`) counts as unset, as it does for a shell: an
    /// empty token would be sent as `Bearer ` and refused, an empty TLS
    /// path would break the three files' pairing.
    pub fn client(&self) -> anyhow::Result<leasehold_client::Client> {
        fn path(path: &Option<std::path::PathBuf>) -> Option<&std::path::Path> {
            path.as_deref().filter(|path| !path.as_os_str().is_empty())
        }
        let mut builder = leasehold_client::Client::builder(&self.addr);
        if let Some(tls) = leasehold_client::ClientTls::from_optional_files(
            path(&self.tls_ca),
            path(&self.tls_cert),
            path(&self.tls_key),
        )? {
            builder = builder.tls(tls);
        }
        if let Some(token) = self.token.as_ref().filter(|token| !token.trim().is_empty()) {
            builder = builder.token(token.clone());
        }
        if self.insecure {
            builder = builder.allow_plaintext_token();
        }
        Ok(builder.build()?)
    }
}

/// Whether `error` says no node was reached: the connection failed on this
/// side (refused, timed out, reset, a TLS handshake that did not happen),
/// as opposed to a node that answered with an error.
pub fn no_node_answered(error: &ClientError) -> bool {
    match error {
        ClientError::Status(status) => {
            let local = std::error::Error::source(status).is_some();
            local
                && matches!(
                    status.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::Unknown
                        | tonic::Code::Cancelled
                        | tonic::Code::DeadlineExceeded
                )
        }
        _ => false,
    }
}

/// Whether a failed call may still have been applied: it was not refused
/// but went unanswered (UNAVAILABLE from the node, such as a write not
/// committed in time, a deadline, a broken connection, an internal error),
/// or the client says so. A call that never connected was not.
pub(crate) fn outcome_unknown(error: &ClientError) -> bool {
    if error.never_sent() {
        return false;
    }
    match error {
        ClientError::Status(status) if leasehold_client::refused_before_proposing(status) => false,
        ClientError::Status(status) => matches!(
            status.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Cancelled
                | tonic::Code::Unknown
                | tonic::Code::Internal
        ),
        ClientError::OutcomeUnknown { .. } => true,
        _ => false,
    }
}

/// What the CLI says when a subcommand fails: where no node answered, the
/// addresses tried and what to check; where a node answered but may have
/// applied a write (`writes`), the error and a word to look before
/// repeating it; else the error.
fn failure_message(error: &anyhow::Error, addr: Option<&str>, writes: bool) -> String {
    let client = error.chain().find_map(|e| e.downcast_ref::<ClientError>());
    match client {
        Some(client) if no_node_answered(client) => {
            unreachable_message(error, client, addr, writes)
        }
        Some(client) if writes && outcome_unknown(client) => format!(
            "{error:#}; the write may have been applied all the same: look before repeating it \
             (an enqueue with --key is never applied twice)"
        ),
        _ => format!("{error:#}"),
    }
}

/// The one-line message for a command that reached no node: the addresses
/// tried, the cause as the system said it, and what to check; for a
/// command that writes (`writes`), whether the write may have been applied.
fn unreachable_message(
    error: &anyhow::Error,
    client: &ClientError,
    addr: Option<&str>,
    writes: bool,
) -> String {
    // The deepest cause is what the system said ("Connection refused").
    let mut cause = first_cause(client);
    while let Some(next) = cause.source() {
        cause = next;
    }
    let tried = match addr {
        Some(addr) => {
            addr.split(',').map(str::trim).filter(|a| !a.is_empty()).collect::<Vec<_>>().join(", ")
        }
        None => "the --addr / LEASEHOLD_ADDR address".to_string(),
    };
    // A context wrapped around the failure (what had been done by then)
    // stays. (`downcast_ref` would see through the context to the client
    // error, so the outermost error is asked.)
    let done = match error.chain().next() {
        Some(outer) if outer.downcast_ref::<ClientError>().is_some() => String::new(),
        _ => format!("{error}; "),
    };
    // Failed while connecting (refused, unroutable, a name that did not
    // resolve, a connect timeout, a TLS handshake): the call never left.
    // Anything else (a timeout, a connection that broke) may have come
    // after a node took a write, so the user of a command that writes is
    // told to look before repeating it; a read has nothing to look for.
    let never_sent = client.never_sent();
    let maybe_applied = if never_sent || !writes {
        ""
    } else {
        "; a write may have been applied before the answer was lost: look before \
         repeating it (an enqueue with --key is never applied twice)"
    };
    format!(
        "{done}no node answered at {tried} ({cause}): check that a node is running there, \
         that --addr or LEASEHOLD_ADDR names its gRPC address, and that a node with TLS \
         is dialled as https:// with --tls-ca, --tls-cert and --tls-key{maybe_applied}"
    )
}

/// Where `client`'s chain of causes starts: a status's own, which the
/// client error's display does not name as its source.
fn first_cause(client: &ClientError) -> &(dyn std::error::Error + 'static) {
    match client {
        ClientError::Status(status) => status,
        other => other,
    }
}

/// Transparent huge pages off for a node, before its threads start:
/// mimalloc asks the kernel for huge pages for its arenas, and a 2 MiB page
/// is resident whole once any byte of it is touched, so with them a node's
/// RSS was about 60 MB higher idle and 20% higher per job held (see
/// docs/benchmarks.md, "Where a node's memory per job goes"). Best effort:
/// where the kernel refuses, the node runs as before. Processes the node
/// starts (the executor's commands) inherit the setting.
#[cfg(target_os = "linux")]
fn disable_huge_pages() {
    if let Err(error) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("warning: transparent huge pages stay on ({error}): the node uses more memory");
    }
}

/// Elsewhere there is no such setting to change.
#[cfg(not(target_os = "linux"))]
fn disable_huge_pages() {}

/// What an invocation runs on the async runtime: a node, resolved before
/// its runtime is built, or one of the other subcommands.
enum Work {
    Serve(serve::Prepared),
    Job(job::JobArgs),
    Cluster(cluster::ClusterArgs),
    Cron(cron::CronArgs),
    Worker(worker::WorkerArgs),
    DevCerts(dev_certs::DevCertsArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let addr = cli.command.addr().map(str::to_string);
    let writes = cli.command.writes();
    // A node's configuration is read before its runtime starts: it says how
    // many threads that runtime gets.
    let work = match cli.command {
        Top::Serve(args) => match serve::prepare(&args) {
            Ok(node) => Work::Serve(node),
            Err(error) => {
                render::write_stderr(&format!("error: {error:#}\n"));
                return std::process::ExitCode::FAILURE;
            }
        },
        Top::Job(args) => Work::Job(args),
        Top::Cluster(args) => Work::Cluster(args),
        Top::Cron(args) => Work::Cron(args),
        Top::Worker(args) => Work::Worker(args),
        Top::DevCerts(args) => Work::DevCerts(args),
        Top::Completions { shell } => {
            // Written through the one writer, not straight to stdout, which
            // panics when the reader is gone or the disk is full.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "leasehold", &mut script);
            render::write_stdout(&String::from_utf8_lossy(&script));
            return if render::stdout_lost() {
                std::process::ExitCode::FAILURE
            } else {
                std::process::ExitCode::SUCCESS
            };
        }
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Work::Serve(node) = &work {
        disable_huge_pages();
        if let Some(threads) = node.runtime_threads() {
            builder.worker_threads(threads);
        }
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            render::write_stderr(&format!("error: cannot start the async runtime: {error}\n"));
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match work {
            Work::Serve(node) => serve::run(node).await,
            Work::Job(args) => job::run(args).await,
            Work::Cluster(args) => cluster::run(args).await,
            Work::Cron(args) => cron::run(args).await,
            Work::Worker(args) => worker::run(args).await,
            Work::DevCerts(args) => dev_certs::run(args),
        }
    });
    // Dropping the runtime would wait for every blocking task still running
    // (a store probe or a snapshot write on a disk that hangs), so a second
    // SIGTERM's "exit at once" could hang with the disk. Its tasks are
    // dropped here (their commands' process groups killed) and blocking
    // work gets a moment: what it leaves undone is what a crash would, and
    // the storage is made to survive that.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
    match result {
        // The output asked for did not all reach its file (a full disk):
        // not a success, whatever the call did.
        Ok(code) if code == std::process::ExitCode::SUCCESS && render::stdout_lost() => {
            std::process::ExitCode::FAILURE
        }
        Ok(code) => code,
        Err(error) => {
            render::write_stderr(&format!(
                "error: {}\n",
                failure_message(&error, addr.as_deref(), writes)
            ));
            std::process::ExitCode::FAILURE
        }
    }
}

/// How long the process waits for blocking work still running when it
/// exits ([`tokio::runtime::Runtime::shutdown_timeout`]).
const RUNTIME_SHUTDOWN: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unanswered_call_may_have_been_applied_a_refused_connection_not() {
        let failed = |kind| {
            let source = std::io::Error::new(kind, "the system's words");
            let source: Box<dyn std::error::Error + Send + Sync> =
                if kind == std::io::ErrorKind::ConnectionRefused {
                    Box::new(tonic::ConnectError(Box::new(source)))
                } else {
                    Box::new(source)
                };
            ClientError::Status(tonic::Status::from_error(source))
        };
        let message = |kind, writes| {
            let error = anyhow::Error::new(failed(kind));
            let client = error.downcast_ref::<ClientError>().map(|client| {
                assert!(no_node_answered(client));
                unreachable_message(&error, client, Some("127.0.0.1:7070"), writes)
            });
            client.unwrap_or_default()
        };
        let refused = message(std::io::ErrorKind::ConnectionRefused, true);
        assert!(refused.contains("no node answered"), "{refused}");
        assert!(!refused.contains("may have been applied"), "{refused}");
        let lost = message(std::io::ErrorKind::ConnectionReset, true);
        assert!(lost.contains("may have been applied"), "{lost}");
        // A read whose connection broke wrote nothing to look for.
        let read = message(std::io::ErrorKind::ConnectionReset, false);
        assert!(read.contains("no node answered"), "{read}");
        assert!(!read.contains("may have been applied"), "{read}");
    }

    #[test]
    fn a_write_a_node_could_not_answer_may_have_been_applied_a_refused_one_not() {
        let message = |status: tonic::Status, writes| {
            failure_message(&anyhow::Error::new(ClientError::Status(status)), None, writes)
        };
        let lost = || tonic::Status::unavailable("no quorum: not committed within 5000 ms");
        let hinted = message(lost(), true);
        assert!(hinted.contains("not committed") && hinted.contains("may have been applied"));
        assert!(!message(lost(), false).contains("may have been applied"), "a read");
        let refused = message(tonic::Status::invalid_argument("queue: bad"), true);
        assert!(!refused.contains("may have been applied"), "{refused}");
        for before in ["draining: this node takes no new claims", "no leader is known yet"] {
            let refused = message(tonic::Status::unavailable(before), true);
            assert!(!refused.contains("may have been applied"), "{refused}");
        }
    }

    /// Every subcommand, at any depth, with its path (`job enqueue`).
    fn walk(command: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
        for sub in command.get_subcommands() {
            let name = format!("{path} {}", sub.get_name()).trim().to_string();
            out.push((name.clone(), sub.clone()));
            walk(sub, &name, out);
        }
    }

    #[tokio::test]
    async fn settings_set_but_empty_count_as_unset() {
        let empty = Connection {
            // Beyond loopback, where a token without TLS is refused.
            addr: "http://10.0.0.1:7070".into(),
            tls_ca: Some("".into()),
            tls_cert: None,
            tls_key: None,
            token: Some(" ".into()),
            insecure: false,
        };
        if let Err(error) = empty.client() {
            panic!("empty settings were taken as given: {error}");
        }
        let token = Connection { token: Some("secret".into()), tls_ca: None, ..empty };
        assert!(token.client().is_err(), "a token without TLS beyond loopback was allowed");
        for (text, value) in [("", false), ("0", false), ("no", false), ("1", true), ("Yes", true)]
        {
            assert_eq!(boolish_or_empty(text), Ok(value), "{text:?}");
        }
        assert!(boolish_or_empty("maybe").is_err_and(|e| e.contains("maybe")));
    }

    #[test]
    fn every_subcommand_shows_examples_in_its_help() {
        let mut commands = Vec::new();
        walk(&Cli::command(), "", &mut commands);
        assert!(commands.len() > 25, "only {} subcommands found", commands.len());
        let mut missing = Vec::new();
        for (name, mut command) in commands {
            let help = command.render_long_help().to_string();
            let examples = help.split("Examples:").nth(1).unwrap_or("");
            // Each example runs the binary, and does so as this subcommand.
            let own = format!("leasehold {name}");
            if !examples.lines().any(|line| line.contains(&own)) {
                missing.push(name);
            }
        }
        assert!(missing.is_empty(), "subcommands without an example of themselves: {missing:?}");
    }

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }
}
