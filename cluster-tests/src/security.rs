//! How a run's nodes and the harness's own clients authenticate.
//!
//! A run is secure by default, so that every fault is also exercised over
//! mutual TLS: before the first node starts, the harness runs the real
//! `leasehold dev-certs` into the run directory (`certs/`), with every
//! node's loopback IP as an extra `--host`, since peers dial each other
//! through the proxies at those IPs and check the certificate against the
//! address dialled. Every node starts with `--tls-ca`, `--tls-cert`,
//! `--tls-key` and `--tokens`. Every harness client presents the client
//! certificate and a token of exactly the role its calls need: producers and
//! the probe `producer`, workers and zombies `worker`, status polls, lease
//! reads, schedule reads and the final reads `reader`, and only what must
//! be admin — putting and pausing the command schedules, `Cluster.SetFlags`,
//! the `Faults` service — `admin`. [`Security::preflight`] checks that the
//! nodes refuse the calls those roles must not make, so a green run also
//! says the roles held.
//!
//! `--plaintext` runs without TLS and tokens, as before the security work;
//! every node is then given the same cluster secret (`cluster-secret` in the
//! run directory, by `--cluster-secret-file`), since a plaintext node proves
//! itself to its peers with an HMAC under it and `Join` no longer hands a
//! secret out.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_client::{Client, ClientError, ClientTls, RetryPolicy};
use leasehold_proto::v1;
use rand::RngCore;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// How the nodes of a run talk to each other and to the harness.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// Mutual TLS between every pair, and client tokens with roles.
    #[default]
    Tls,
    /// No TLS, no tokens; nodes prove themselves with a shared secret.
    Plaintext,
}

/// A client role of the tokens file (`docs/security.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// Anything: schedules, cluster changes, faults, command queues.
    Admin,
    /// Enqueue and redrive on queues that are not command queues.
    Producer,
    /// Claim, refresh, ack, nack, release (not on command queues).
    Worker,
    /// Reads.
    Reader,
}

impl Role {
    /// Every role, in the order of the token files.
    pub const ALL: [Role; 4] = [Role::Admin, Role::Producer, Role::Worker, Role::Reader];

    /// The role's name, as in `token-NAME`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Producer => "producer",
            Role::Worker => "worker",
            Role::Reader => "reader",
        }
    }

    fn index(self) -> usize {
        match self {
            Role::Admin => 0,
            Role::Producer => 1,
            Role::Worker => 2,
            Role::Reader => 3,
        }
    }
}

/// The TLS material and tokens of a secure run.
struct TlsSetup {
    dir: PathBuf,
    client: ClientTls,
    /// `authorization` header values, by [`Role::index`].
    bearers: [AsciiMetadataValue; 4],
    /// The raw tokens, by [`Role::index`].
    tokens: [String; 4],
}

enum Inner {
    Tls(Box<TlsSetup>),
    Plaintext { secret_file: PathBuf },
}

/// The run's credentials: what each node is started with, and what each
/// harness client presents. Cheap to clone.
#[derive(Clone)]
pub struct Security {
    inner: Arc<Inner>,
}

/// Adds a client's bearer token (if any) to every call of a raw stub.
#[derive(Clone)]
pub struct Bearer(Option<AsciiMetadataValue>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A raw stub's channel whose calls carry a role's token.
pub type AuthChannel = InterceptedService<Channel, Bearer>;

/// How long `dev-certs` may take.
const DEV_CERTS_LIMIT: Duration = Duration::from_secs(60);
/// How long the role checks may keep retrying a cluster that is settling.
const PREFLIGHT_CALL_LIMIT: Duration = Duration::from_secs(20);

impl Security {
    /// Prepares `transport` for a run in `run_dir` of `nodes` nodes at
    /// `ips`: writes the certificates and tokens with `bin dev-certs`, or
    /// the shared cluster secret.
    pub async fn prepare(
        transport: Transport,
        bin: &Path,
        run_dir: &Path,
        nodes: u64,
        ips: &[Ipv4Addr],
    ) -> anyhow::Result<Security> {
        let inner = match transport {
            Transport::Plaintext => {
                let secret_file = run_dir.join("cluster-secret");
                let mut raw = [0u8; 32];
                rand::thread_rng().fill_bytes(&mut raw);
                let text: String = raw.iter().map(|b| format!("{b:02x}")).collect();
                std::fs::write(&secret_file, text + "\n")
                    .map_err(|e| anyhow::anyhow!("writing {}: {e}", secret_file.display()))?;
                Inner::Plaintext { secret_file }
            }
            Transport::Tls => {
                Inner::Tls(Box::new(dev_certs(bin, &run_dir.join("certs"), nodes, ips).await?))
            }
        };
        Ok(Security { inner: Arc::new(inner) })
    }

    /// What the run uses, for the summary.
    pub fn describe(&self) -> &'static str {
        match &*self.inner {
            Inner::Tls(_) => "mutual TLS, tokens by role",
            Inner::Plaintext { .. } => "plaintext, shared cluster secret",
        }
    }

    /// Whether the run speaks TLS.
    pub fn is_tls(&self) -> bool {
        matches!(&*self.inner, Inner::Tls(_))
    }

    /// The `serve` flags node `id` needs.
    pub fn node_args(&self, id: u64) -> Vec<OsString> {
        match &*self.inner {
            Inner::Tls(tls) => {
                let file = |name: String| tls.dir.join(name).into_os_string();
                vec![
                    "--tls-ca".into(),
                    file("ca.pem".to_string()),
                    "--tls-cert".into(),
                    file(format!("node-{id}.pem")),
                    "--tls-key".into(),
                    file(format!("node-{id}.key")),
                    "--tokens".into(),
                    file("tokens.toml".to_string()),
                ]
            }
            Inner::Plaintext { secret_file } => {
                vec!["--cluster-secret-file".into(), secret_file.clone().into_os_string()]
            }
        }
    }

    /// A client for `addrs` (comma-separated `host:port`) calling as `role`.
    pub fn client(&self, addrs: &str, role: Role) -> Result<Client, ClientError> {
        match &*self.inner {
            Inner::Tls(tls) => Client::builder(addrs)
                .tls(tls.client.clone())
                .token(tls.tokens[role.index()].clone())
                .build(),
            Inner::Plaintext { .. } => Client::connect(addrs),
        }
    }

    /// A client with the client certificate but no token (preflight only).
    fn client_without_token(&self, addrs: &str) -> Result<Client, ClientError> {
        match &*self.inner {
            Inner::Tls(tls) => Client::builder(addrs).tls(tls.client.clone()).build(),
            Inner::Plaintext { .. } => Client::connect(addrs),
        }
    }

    /// A lazy channel to one node at `addr` (for the raw stubs the
    /// supervisor uses to reach a node directly, past its proxy).
    pub fn channel(&self, addr: SocketAddr) -> anyhow::Result<Channel> {
        let scheme = if self.is_tls() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| anyhow::anyhow!("endpoint {addr}: {e}"))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true);
        if let Inner::Tls(tls) = &*self.inner {
            let config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&tls.client.ca_pem))
                .identity(Identity::from_pem(&tls.client.cert_pem, &tls.client.key_pem));
            endpoint =
                endpoint.tls_config(config).map_err(|e| anyhow::anyhow!("tls for {addr}: {e}"))?;
        }
        Ok(endpoint.connect_lazy())
    }

    /// `channel` with `role`'s token on every call.
    pub fn intercept(&self, channel: Channel, role: Role) -> AuthChannel {
        let bearer = match &*self.inner {
            Inner::Tls(tls) => Some(tls.bearers[role.index()].clone()),
            Inner::Plaintext { .. } => None,
        };
        InterceptedService::new(channel, Bearer(bearer))
    }

    /// Checks, against the formed cluster at `addrs`, that the roles the
    /// workload relies on hold both ways: each role's token gets a call it
    /// needs, and the nodes refuse the calls it must not make (a worker
    /// cannot enqueue or claim a command, a producer cannot claim, a reader
    /// cannot write, a certificate without a token gets nothing). Refused
    /// calls never reach a service, so they change nothing. Answers what was
    /// checked; plaintext runs have no roles to check.
    pub async fn preflight(&self, addrs: &[String]) -> anyhow::Result<String> {
        if !self.is_tls() {
            return Ok("no roles (plaintext)".to_string());
        }
        let addrs = addrs.join(",");
        let retry = RetryPolicy {
            attempts: 20,
            first_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(1),
        };
        let client = |role: Role| -> anyhow::Result<Client> {
            Ok(self.client(&addrs, role)?.with_retry(retry))
        };
        let enqueue = |client: Client| async move {
            let spec = v1::JobSpec {
                queue: "preflight".to_string(),
                payload: b"must be refused".to_vec(),
                idempotency_key: Some("preflight".to_string()),
                ..v1::JobSpec::default()
            };
            client.enqueue(vec![spec]).await.map(|_| ())
        };
        let claim = |client: Client, queue: &'static str| async move {
            let request = v1::ClaimRequest {
                worker: "preflight".to_string(),
                queue: queue.to_string(),
                max: 1,
                lease_ttl_ms: Some(1_000),
                selector: Vec::new(),
                wait_ms: 0,
                ..Default::default()
            };
            client.claim(request).await.map(|_| ())
        };
        let mut checked = 0;
        for role in [Role::Reader, Role::Producer, Role::Worker, Role::Admin] {
            let reader = client(role)?;
            expect(format!("{} token reads the status", role.name()), None, async move {
                reader.status().await.map(|_| ())
            })
            .await?;
            checked += 1;
        }
        let refusals: Vec<(String, tonic::Code, Client, Option<&'static str>)> = vec![
            (
                "a reader token enqueues".into(),
                tonic::Code::PermissionDenied,
                client(Role::Reader)?,
                None,
            ),
            (
                "a worker token enqueues".into(),
                tonic::Code::PermissionDenied,
                client(Role::Worker)?,
                None,
            ),
            (
                "a producer token claims".into(),
                tonic::Code::PermissionDenied,
                client(Role::Producer)?,
                Some("preflight"),
            ),
            (
                "a worker token claims on the command queue".into(),
                tonic::Code::PermissionDenied,
                client(Role::Worker)?,
                Some(crate::cron::COMMAND_QUEUE),
            ),
            (
                "a client certificate without a token enqueues".into(),
                tonic::Code::Unauthenticated,
                self.client_without_token(&addrs)?.with_retry(retry),
                None,
            ),
        ];
        for (what, code, client, claim_queue) in refusals {
            match claim_queue {
                Some(queue) => expect(what, Some(code), claim(client, queue)).await?,
                None => expect(what, Some(code), enqueue(client)).await?,
            }
            checked += 1;
        }
        Ok(format!("{} role checks passed ({} refusals)", checked, checked - 4))
    }
}

/// Runs `call` (bounded) and checks it ended as `refused` says: ok when
/// `None`, refused with that code otherwise.
async fn expect(
    what: String,
    refused: Option<tonic::Code>,
    call: impl std::future::Future<Output = Result<(), ClientError>>,
) -> anyhow::Result<()> {
    let ended = tokio::time::timeout(PREFLIGHT_CALL_LIMIT, call)
        .await
        .map_err(|_| anyhow::anyhow!("role check \"{what}\": no answer in time"))?;
    match (refused, ended) {
        (None, Ok(())) => Ok(()),
        (None, Err(error)) => anyhow::bail!("role check \"{what}\": refused: {error}"),
        (Some(code), Err(error)) if error.code() == code => Ok(()),
        (Some(code), Err(error)) => {
            anyhow::bail!("role check \"{what}\": expected {code:?}, got {error}")
        }
        (Some(code), Ok(())) => {
            anyhow::bail!("role check \"{what}\": expected {code:?}, but the call was served")
        }
    }
}

/// Runs `bin dev-certs` into `dir` and reads what it wrote.
async fn dev_certs(
    bin: &Path,
    dir: &Path,
    nodes: u64,
    ips: &[Ipv4Addr],
) -> anyhow::Result<TlsSetup> {
    let mut command = tokio::process::Command::new(bin);
    command.arg("dev-certs").arg(dir).arg("--nodes").arg(nodes.to_string());
    for ip in ips {
        command.arg("--host").arg(ip.to_string());
    }
    command.stdin(std::process::Stdio::null()).kill_on_drop(true);
    let output = tokio::time::timeout(DEV_CERTS_LIMIT, command.output())
        .await
        .map_err(|_| anyhow::anyhow!("{} dev-certs did not finish in time", bin.display()))?
        .map_err(|e| anyhow::anyhow!("running {} dev-certs: {e}", bin.display()))?;
    if !output.status.success() {
        anyhow::bail!(
            "{} dev-certs {} failed ({}): {}",
            bin.display(),
            dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let client = ClientTls::from_files(
        &dir.join("ca.pem"),
        &dir.join("client.pem"),
        &dir.join("client.key"),
    )
    .map_err(|e| anyhow::anyhow!("reading the dev certificates: {e}"))?;
    let mut tokens: [String; 4] = Default::default();
    let mut bearers: Vec<AsciiMetadataValue> = Vec::new();
    for role in Role::ALL {
        let path = dir.join(format!("token-{}", role.name()));
        let token = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?
            .trim()
            .to_string();
        if token.is_empty() {
            anyhow::bail!("{} is empty", path.display());
        }
        let bearer = AsciiMetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| anyhow::anyhow!("{}: not a token a header can carry", path.display()))?;
        tokens[role.index()] = token;
        bearers.push(bearer);
    }
    let bearers: [AsciiMetadataValue; 4] =
        bearers.try_into().map_err(|_| anyhow::anyhow!("one token per role expected"))?;
    Ok(TlsSetup { dir: dir.to_path_buf(), client, bearers, tokens })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_index_their_token_files_in_order() {
        let indexes: Vec<usize> = Role::ALL.iter().map(|r| r.index()).collect();
        assert_eq!(indexes, vec![0, 1, 2, 3]);
        let names: Vec<&str> = Role::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names, vec!["admin", "producer", "worker", "reader"]);
    }

    #[tokio::test]
    async fn plaintext_gives_every_node_the_same_secret_file() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let security = Security::prepare(
            Transport::Plaintext,
            Path::new("unused"),
            dir.path(),
            3,
            &[Ipv4Addr::new(127, 0, 0, 11)],
        )
        .await?;
        assert!(!security.is_tls());
        let one = security.node_args(1);
        assert_eq!(one, security.node_args(2), "one secret for every node");
        assert_eq!(
            one.first().map(|a| a.to_string_lossy().into_owned()).as_deref(),
            Some("--cluster-secret-file")
        );
        let secret = std::fs::read_to_string(dir.path().join("cluster-secret"))?;
        assert!(secret.trim().len() >= 32, "long enough for the node's minimum");
        // Plaintext clients carry no token.
        let channel = security.channel("127.0.0.1:1".parse()?)?;
        let _stub = security.intercept(channel, Role::Admin);
        Ok(())
    }
}
