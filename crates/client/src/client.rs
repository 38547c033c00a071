//! The typed client: one channel, generated stubs, and retries of
//! UNAVAILABLE answers that are safe to repeat.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use leasehold_proto::v1;
use leasehold_proto::v1::cluster_client::ClusterClient;
use leasehold_proto::v1::queue_client::QueueClient;
use leasehold_proto::v1::schedules_client::SchedulesClient;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Why a call failed: the server's status (its code says what kind), or a
/// connection problem.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not a valid endpoint.
    #[error("address {addr}: {source}")]
    Address {
        /// The address given.
        addr: String,
        /// Why it is invalid.
        source: tonic::transport::Error,
    },
    /// No address was given.
    #[error("no node address given")]
    NoAddress,
    /// The server answered with an error status.
    #[error("{} ({:?})", .0.message(), .0.code())]
    Status(tonic::Status),
    /// TLS material could not be read or used; names the flag or file.
    #[error("{0}")]
    Tls(String),
    /// A credential cannot travel as call metadata (a token with a newline,
    /// say), or the address's scheme does not match the TLS setting.
    #[error("{0}")]
    Credential(String),
    /// The call's effect is unknown: a try got no answer (the connection
    /// broke, or the node said UNAVAILABLE), so it may have applied, and
    /// the retry was refused for a reason that try itself would cause — a
    /// release that applied leaves its token stale. Code `Unknown`.
    #[error(
        "outcome unknown: a try failed in transit ({}) and may have applied; the retry was refused: {} ({:?})",
        .first.message(), .last.message(), .last.code()
    )]
    OutcomeUnknown {
        /// The failure that left the first try's effect unknown.
        first: tonic::Status,
        /// The retry's refusal.
        last: tonic::Status,
    },
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        ClientError::Status(status)
    }
}

impl ClientError {
    /// The gRPC code of the failure (`Unavailable` for connection problems).
    pub fn code(&self) -> tonic::Code {
        match self {
            ClientError::Address { .. }
            | ClientError::NoAddress
            | ClientError::Tls(_)
            | ClientError::Credential(_) => tonic::Code::InvalidArgument,
            ClientError::Status(status) => status.code(),
            ClientError::OutcomeUnknown { .. } => tonic::Code::Unknown,
        }
    }

    /// Whether the call surely reached no node, so a write it carried was
    /// not applied: the client refused it before dialling, or every try
    /// failed while connecting (refused, unroutable, a name that did not
    /// resolve, a connect timeout, a TLS handshake that failed). A call
    /// that broke or timed out after connecting may have been applied.
    pub fn never_sent(&self) -> bool {
        match self {
            ClientError::Address { .. }
            | ClientError::NoAddress
            | ClientError::Tls(_)
            | ClientError::Credential(_) => true,
            ClientError::Status(status) => connect_failure(status),
            ClientError::OutcomeUnknown { .. } => false,
        }
    }
}

/// Whether `status` is this side's failure to connect (TCP, name lookup or
/// TLS handshake): tonic marks those with [`tonic::ConnectError`] in the
/// status's chain of causes, and no request went out on them.
fn connect_failure(status: &tonic::Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(error) = cause {
        if error.downcast_ref::<tonic::ConnectError>().is_some() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Bounded retries with exponential delay.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub attempts: u32,
    /// Delay before the second try; doubles after each.
    pub first_delay: Duration,
    /// Upper bound of the delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        }
    }
}

/// Whether a failed call may be repeated: the server said UNAVAILABLE, or
/// the call never got an answer because the connection broke under it (a
/// node killed mid-call). tonic reports the latter as UNKNOWN "transport
/// error", or CANCELLED "operation was canceled" for a call still queued on
/// the dead connection, with the local cause as the status's source; a
/// status the server sent never has a source, so the server's own UNKNOWN
/// or CANCELLED is not retried.
fn is_retryable(status: &tonic::Status) -> bool {
    let local = std::error::Error::source(status).is_some();
    match status.code() {
        tonic::Code::Unavailable => true,
        tonic::Code::Unknown | tonic::Code::Cancelled => local,
        _ => false,
    }
}

/// The metadata every call of a client carries: its bearer token, and
/// anything else it was given (a node's proof, for a node's own executor).
#[derive(Clone, Default)]
pub struct Credentials {
    metadata: Arc<Vec<(AsciiMetadataKey, AsciiMetadataValue)>>,
}

impl Interceptor for Credentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        for (key, value) in self.metadata.iter() {
            request.metadata_mut().insert(key.clone(), value.clone());
        }
        Ok(request)
    }
}

/// A channel whose calls carry the client's [`Credentials`].
pub type AuthChannel = InterceptedService<Channel, Credentials>;

/// TLS for a client: the cluster's CA (the only issuer it trusts) and the
/// client's own certificate and key, all PEM. leasehold nodes ask every
/// client for a certificate.
#[derive(Clone)]
pub struct ClientTls {
    /// The cluster's CA certificate(s).
    pub ca_pem: Vec<u8>,
    /// This client's certificate chain.
    pub cert_pem: Vec<u8>,
    /// This client's private key.
    pub key_pem: Vec<u8>,
    /// The name the server's certificate must carry, when it is not the
    /// host of the address dialled (a node dialling its own listener on
    /// loopback checks its advertised name).
    pub domain: Option<String>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls { .. }")
    }
}

impl ClientTls {
    /// Reads the three PEM files (`--tls-ca`, `--tls-cert`, `--tls-key`).
    pub fn from_files(
        ca: &std::path::Path,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<ClientTls, ClientError> {
        let read = |flag: &str, path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| ClientError::Tls(format!("{flag} {}: {e}", path.display())))
        };
        Ok(ClientTls {
            ca_pem: read("--tls-ca", ca)?,
            cert_pem: read("--tls-cert", cert)?,
            key_pem: read("--tls-key", key)?,
            domain: None,
        })
    }

    /// TLS from the three files of `--tls-ca`, `--tls-cert` and `--tls-key`
    /// (or `LEASEHOLD_TLS_*`) given together, `None` when none is given; one
    /// or two of them alone is an error naming all three.
    pub fn from_optional_files(
        ca: Option<&std::path::Path>,
        cert: Option<&std::path::Path>,
        key: Option<&std::path::Path>,
    ) -> Result<Option<ClientTls>, ClientError> {
        match (ca, cert, key) {
            (Some(ca), Some(cert), Some(key)) => ClientTls::from_files(ca, cert, key).map(Some),
            (None, None, None) => Ok(None),
            _ => Err(ClientError::Tls(
                "--tls-ca, --tls-cert and --tls-key go together (LEASEHOLD_TLS_CA, \
                 LEASEHOLD_TLS_CERT, LEASEHOLD_TLS_KEY): give all three or none"
                    .to_string(),
            )),
        }
    }

    fn config(&self) -> ClientTlsConfig {
        let config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca_pem))
            .identity(Identity::from_pem(&self.cert_pem, &self.key_pem));
        match &self.domain {
            Some(domain) => config.domain_name(domain.clone()),
            None => config,
        }
    }
}

/// How to reach and authenticate to the cluster; [`Client::builder`].
#[derive(Clone)]
pub struct ClientBuilder {
    addrs: String,
    tls: Option<ClientTls>,
    metadata: Vec<(String, String)>,
    plaintext_token: bool,
    keepalive: Keepalive,
}

/// How a client finds out that a connection died without closing (a
/// node's machine lost, a link that swallows packets): it pings the node
/// every `interval`, idle or not, and drops the connection when a ping is
/// not answered within `timeout`. The next call connects again, and a
/// session on that connection ends, so its calls fail at once instead of
/// each waiting out its own timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    /// Between pings.
    pub interval: Duration,
    /// How long a ping may go unanswered.
    pub timeout: Duration,
}

impl Default for Keepalive {
    /// A ping every 10 s, 10 s to answer it: a dead connection is found
    /// within 20 s, inside a lease's default TTL of 30 s.
    fn default() -> Keepalive {
        Keepalive { interval: Duration::from_secs(10), timeout: Duration::from_secs(10) }
    }
}

/// The header names only: their values are credentials (a token, a node
/// proof).
impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<&str> = self.metadata.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("ClientBuilder")
            .field("addrs", &self.addrs)
            .field("tls", &self.tls)
            .field("headers", &headers)
            .field("plaintext_token", &self.plaintext_token)
            .field("keepalive", &self.keepalive)
            .finish()
    }
}

impl ClientBuilder {
    /// Speaks TLS with this CA and client certificate. Addresses given as
    /// `host:port` are then dialled as `https://`.
    pub fn tls(mut self, tls: ClientTls) -> ClientBuilder {
        self.tls = Some(tls);
        self
    }

    /// Sends `authorization: Bearer TOKEN` on every call (a node with a
    /// tokens file asks for it).
    pub fn token(mut self, token: impl Into<String>) -> ClientBuilder {
        self.metadata.push(("authorization".into(), format!("Bearer {}", token.into().trim())));
        self
    }

    /// Lets a token travel without TLS to an address beyond loopback:
    /// only for a node run with `--insecure`, on a network the token may
    /// cross in the clear. Without it such a client is refused when built.
    pub fn allow_plaintext_token(mut self) -> ClientBuilder {
        self.plaintext_token = true;
        self
    }

    /// Pings each node as `keepalive` says ([`Keepalive::default`] unless
    /// set).
    pub fn keepalive(mut self, keepalive: Keepalive) -> ClientBuilder {
        self.keepalive = keepalive;
        self
    }

    /// Sends `name: value` on every call.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> ClientBuilder {
        self.metadata.push((name.into(), value.into()));
        self
    }

    /// The client. Connects lazily, so a node that is still starting is not
    /// an error here; bad addresses, unreadable TLS material and
    /// credentials that cannot be sent are.
    pub fn build(self) -> Result<Client, ClientError> {
        self.build_with(|endpoint| endpoint.connect_lazy())
    }

    /// [`ClientBuilder::build`], with each address's endpoint (its TLS
    /// and timeouts set) turned into a channel by `channel` instead of the
    /// operating system's TCP: a simulation dials its own network with
    /// [`Endpoint::connect_with_connector_lazy`].
    pub fn build_with(self, channel: impl Fn(&Endpoint) -> Channel) -> Result<Client, ClientError> {
        let mut metadata = Vec::new();
        for (name, value) in &self.metadata {
            let key = AsciiMetadataKey::from_bytes(name.as_bytes())
                .map_err(|_| ClientError::Credential(format!("{name}: not a valid header name")))?;
            let value = AsciiMetadataValue::try_from(value.as_str()).map_err(|_| {
                let what = if name == "authorization" { "token" } else { name.as_str() };
                ClientError::Credential(format!("{what}: holds characters a header cannot carry"))
            })?;
            metadata.push((key, value));
        }
        let credentials = Credentials { metadata: Arc::new(metadata) };
        let tls = self.tls.as_ref().map(ClientTls::config);
        let sends_token =
            self.metadata.iter().any(|(name, _)| name.eq_ignore_ascii_case("authorization"));
        let mut nodes = Vec::new();
        let mut plain = Vec::new();
        for addr in self.addrs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            plain.push(host_port(addr).to_string());
            if tls.is_none() && sends_token && !self.plaintext_token && !is_loopback(addr) {
                return Err(ClientError::Credential(format!(
                    "address {addr}: the token would cross the network unencrypted; talk TLS \
                     (--tls-ca, --tls-cert, --tls-key), or for a node run with --insecure \
                     allow it (the CLI's --insecure or LEASEHOLD_INSECURE=1, the SDK's \
                     allow_plaintext_token)"
                )));
            }
            if host_port(addr).contains('@') {
                // `user@host`: the part before `@` is not where the call
                // goes, and would fool the loopback test above.
                return Err(ClientError::Credential(format!(
                    "address {addr}: an address names no user (`@`)"
                )));
            }
            // Schemes are case-insensitive: `HTTPS://` is https, and
            // anything else but http and https is refused rather than
            // dialled without the TLS that was asked for.
            let scheme = addr.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
            let uri = match (scheme.as_deref(), &tls) {
                (None, Some(_)) => format!("https://{addr}"),
                (None, None) => format!("http://{addr}"),
                (Some("https"), Some(_)) | (Some("http"), None) => addr.to_string(),
                (Some("http"), Some(_)) => {
                    return Err(ClientError::Credential(format!(
                        "address {addr}: TLS is configured, so the address must be https:// (or host:port)"
                    )));
                }
                (Some("https"), None) => {
                    return Err(ClientError::Credential(format!(
                        "address {addr}: https needs --tls-ca, --tls-cert and --tls-key \
                         (LEASEHOLD_TLS_CA, LEASEHOLD_TLS_CERT, LEASEHOLD_TLS_KEY)"
                    )));
                }
                (Some(other), _) => {
                    return Err(ClientError::Credential(format!(
                        "address {addr}: scheme {other:?} is neither http nor https"
                    )));
                }
            };
            let mut endpoint = Endpoint::from_shared(uri)
                .map_err(|source| ClientError::Address { addr: addr.to_string(), source })?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(self.keepalive.interval)
                .keep_alive_timeout(self.keepalive.timeout)
                .keep_alive_while_idle(true);
            if let Some(tls) = &tls {
                endpoint = endpoint
                    .tls_config(tls.clone())
                    .map_err(|e| ClientError::Tls(format!("tls: {e}")))?;
            }
            let channel = InterceptedService::new(channel(&endpoint), credentials.clone());
            nodes.push(Stubs {
                queue: QueueClient::new(channel.clone())
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
                // Status and schedule lists grow with the members and the
                // schedules: the same bound as the queue's, not tonic's
                // default of 4 MiB, past which every list would fail.
                cluster: ClusterClient::new(channel.clone())
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
                schedules: SchedulesClient::new(channel)
                    .max_decoding_message_size(MAX_MESSAGE_BYTES)
                    .max_encoding_message_size(MAX_MESSAGE_BYTES),
            });
        }
        if nodes.is_empty() {
            return Err(ClientError::NoAddress);
        }
        Ok(Client {
            connections: Arc::new(RwLock::new(Arc::new(Connections { nodes, addrs: plain }))),
            follow_hints: true,
            current: Arc::new(AtomicUsize::new(0)),
            retry: RetryPolicy::default(),
            call_timeout: CALL_TIMEOUT,
        })
    }
}

/// What a client calls: stubs over each node's channel, and the nodes'
/// addresses as `host:port` in the same order. Replaced whole by
/// [`Client::reconnect`].
struct Connections {
    nodes: Vec<Stubs>,
    addrs: Vec<String>,
}

/// Stubs over one node's channel.
#[derive(Clone)]
struct Stubs {
    queue: QueueClient<AuthChannel>,
    cluster: ClusterClient<AuthChannel>,
    schedules: SchedulesClient<AuthChannel>,
}

/// A connection to one or more leasehold nodes. Calls go to one node at a
/// time; an UNAVAILABLE answer (including a refused connection) or a
/// connection that broke mid-call moves the client to the next address
/// before it retries. A follower names the leader on its answers
/// ([`leasehold_proto::LEADER_HINT_HEADER`]); when that address is one of
/// the client's own, the client moves there, so its writes skip the
/// follower's forwarding hop.
#[derive(Clone)]
pub struct Client {
    /// Shared by every clone, so a [`Client::reconnect`] moves them all.
    connections: Arc<RwLock<Arc<Connections>>>,
    /// Whether a leader hint moves the client (see [`Client::follow_leader_hints`]).
    follow_hints: bool,
    current: Arc<AtomicUsize>,
    retry: RetryPolicy,
    call_timeout: Duration,
}

/// Deadline of a call that does not wait by design.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest message either side sends (a claim of many large payloads).
const MAX_MESSAGE_BYTES: usize = 512 * 1024 * 1024;

impl Client {
    /// A client for `addrs`: one address or several separated by commas
    /// (`host:port` or `http://host:port` each), without TLS or token.
    /// Connects lazily, so a node that is still starting is not an error
    /// here.
    pub fn connect(addrs: &str) -> Result<Client, ClientError> {
        Client::builder(addrs).build()
    }

    /// A builder for `addrs`, to add TLS and a token.
    pub fn builder(addrs: &str) -> ClientBuilder {
        ClientBuilder {
            addrs: addrs.to_string(),
            tls: None,
            metadata: Vec::new(),
            plaintext_token: false,
            keepalive: Keepalive::default(),
        }
    }

    fn connections(&self) -> Arc<Connections> {
        self.connections.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// What `pick` takes from the current node's stubs.
    fn stub<T>(&self, pick: impl FnOnce(&Stubs) -> T) -> T {
        let connections = self.connections();
        let index = self.current.load(Ordering::Relaxed) % connections.nodes.len();
        pick(&connections.nodes[index])
    }

    fn queue(&self) -> QueueClient<AuthChannel> {
        self.stub(|stubs| stubs.queue.clone())
    }

    fn cluster(&self) -> ClusterClient<AuthChannel> {
        self.stub(|stubs| stubs.cluster.clone())
    }

    /// Moves this client, and every clone of it, onto `fresh`'s
    /// connections: their next calls open new connections as `fresh` was
    /// built to (new TLS material, say), while calls and sessions under
    /// way finish on the old ones. A node's built-in executor takes the
    /// node's reloaded certificate and CA bundle this way on SIGHUP; a
    /// connection opened with the old ones would fail its handshake once
    /// the node's certificate comes from a CA they lack. Where each clone
    /// is among the addresses is kept (modulo their number).
    pub fn reconnect(&self, fresh: &Client) {
        let connections = fresh.connections();
        *self.connections.write().unwrap_or_else(PoisonError::into_inner) = connections;
    }

    /// Moves to the next address (after an UNAVAILABLE answer).
    fn rotate(&self) {
        if self.connections().nodes.len() > 1 {
            self.current.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Moves to the node a follower named as the leader, when it is one of
    /// this client's addresses.
    fn follow_leader(&self, metadata: &tonic::metadata::MetadataMap) {
        if !self.follow_hints {
            return;
        }
        let Some(hint) = metadata.get(leasehold_proto::LEADER_HINT_HEADER) else { return };
        let Ok(hint) = hint.to_str() else { return };
        let hint = host_port(hint);
        if let Some(index) = self.connections().addrs.iter().position(|addr| addr == hint) {
            self.current.store(index, Ordering::Relaxed);
        }
    }

    /// Follows a leader hint in `metadata`; whether the client moved.
    pub(crate) fn moved_to_leader(&self, metadata: &tonic::metadata::MetadataMap) -> bool {
        let count = self.connections().nodes.len();
        let before = self.current.load(Ordering::Relaxed) % count;
        self.follow_leader(metadata);
        self.current.load(Ordering::Relaxed) % count != before
    }

    /// The deadline of a call that does not wait by design.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// The same client, following leader hints (the default) or not. A
    /// client that does not stays on its first address until that node
    /// fails, and its writes are forwarded by whichever node it is on — to
    /// keep linearizable reads spread over the followers, say. Clones of
    /// one client share where they are; the client this answers has a
    /// place of its own (starting where this one is), so hints another
    /// clone follows do not move it.
    pub fn follow_leader_hints(mut self, follow: bool) -> Client {
        self.follow_hints = follow;
        self.current = Arc::new(AtomicUsize::new(self.current.load(Ordering::Relaxed)));
        self
    }

    /// The same client with another retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Client {
        self.retry = retry;
        self
    }

    /// The generated Schedules stub of the current node.
    pub fn schedules_stub(&self) -> SchedulesClient<AuthChannel> {
        self.stub(|stubs| stubs.schedules.clone())
    }

    /// The generated Queue stub of the current node, for calls this client
    /// does not wrap.
    pub fn queue_stub(&self) -> QueueClient<AuthChannel> {
        self.queue()
    }

    /// Makes `call` (against the current node), retrying transient
    /// failures on the next node — when not `retry`, only failures that
    /// wrote nothing (see [`Repeat::UntilSent`]); follows a leader hint on
    /// the answer. `retry` for calls whose repeat answers the same as the
    /// first try (reads, acks, claims and triggers under a request id).
    async fn retrying<T, F, Fut>(&self, retry: bool, call: F) -> Result<T, ClientError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.retrying_as(if retry { Repeat::Same } else { Repeat::UntilSent }, call).await
    }

    async fn retrying_as<T, F, Fut>(&self, repeat: Repeat, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let attempts = self.retry.attempts.max(1);
        let mut delay = self.retry.first_delay;
        let mut tried = 0;
        let mut in_transit: Option<tonic::Status> = None;
        loop {
            tried += 1;
            match call().await {
                Ok(response) => {
                    self.follow_leader(response.metadata());
                    return Ok(response.into_inner());
                }
                Err(status)
                    if is_retryable(&status)
                        && tried < attempts
                        && (repeat != Repeat::UntilSent
                            || connect_failure(&status)
                            || refused_before_proposing(&status)) =>
                {
                    tracing::debug!(%status, tried, "retrying after a transient failure");
                    // A try that never connected cannot have applied, nor
                    // one the node refused before proposing anything.
                    if !connect_failure(&status) && !refused_before_proposing(&status) {
                        in_transit.get_or_insert(status);
                    }
                    self.rotate();
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.retry.max_delay);
                }
                Err(status) => return Err(final_error(repeat, in_transit, status)),
            }
        }
    }

    fn request<T>(&self, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(timeout);
        request
    }

    /// Enqueues jobs atomically. Retried on UNAVAILABLE only when every job
    /// carries an idempotency key, since an unanswered enqueue may still
    /// have committed; otherwise only after a try that wrote nothing.
    pub async fn enqueue(
        &self,
        jobs: Vec<v1::JobSpec>,
    ) -> Result<Vec<v1::EnqueueResult>, ClientError> {
        let retry = !jobs.is_empty() && jobs.iter().all(|j| j.idempotency_key.is_some());
        let message = v1::EnqueueRequest { jobs };
        self.retrying(retry, || {
            let mut stub = self.queue();
            let request = self.request(message.clone(), self.call_timeout);
            async move { stub.enqueue(request).await }
        })
        .await
        .map(|r| r.results)
    }

    /// Claims up to `max` jobs, long-polling up to `wait_ms`.
    pub async fn claim(&self, request: v1::ClaimRequest) -> Result<Vec<v1::Grant>, ClientError> {
        self.claim_with_wait(request).await.map(|r| r.grants)
    }

    /// Claims up to `max` jobs, long-polling up to `wait_ms`, and answers
    /// how long the node held the call before the claim that granted them
    /// (`waited_ms`, for the lease's local deadline). Every try carries the
    /// same request id (one is made when the request has none), so a retry
    /// after a lost answer gets the first try's leases, not new ones.
    pub async fn claim_with_wait(
        &self,
        mut request: v1::ClaimRequest,
    ) -> Result<v1::ClaimResponse, ClientError> {
        if request.request_id.is_empty() {
            request.request_id = new_request_id();
        }
        let timeout = self.call_timeout + Duration::from_millis(request.wait_ms);
        self.retrying(true, || {
            let mut stub = self.queue();
            let request = self.request(request.clone(), timeout);
            async move { stub.claim(request).await }
        })
        .await
    }

    /// Runs schedule `name` now (past its overlap policy with `force`),
    /// retried on UNAVAILABLE under one request id, so a retry after a lost
    /// answer does not run it twice.
    pub async fn trigger(
        &self,
        name: &str,
        force: bool,
    ) -> Result<v1::TriggerScheduleResponse, ClientError> {
        let message = v1::TriggerScheduleRequest {
            name: name.to_string(),
            force,
            request_id: new_request_id(),
        };
        self.retrying(true, || {
            let mut stub = self.schedules_stub();
            let request = self.request(message.clone(), self.call_timeout);
            async move { stub.trigger(request).await }
        })
        .await
    }

    /// Renews leases; answers the renewed leases and the lost job ids.
    pub async fn refresh(
        &self,
        request: v1::RefreshRequest,
    ) -> Result<v1::RefreshResponse, ClientError> {
        self.retrying(true, || {
            let mut stub = self.queue();
            let request = self.request(request.clone(), self.call_timeout);
            async move { stub.refresh(request).await }
        })
        .await
    }

    /// Acks a job (idempotent for the same token, so retried).
    pub async fn ack(&self, job_id: u64, token: u64) -> Result<(), ClientError> {
        self.ack_with_result(job_id, token, Vec::new()).await
    }

    /// Finishes a job and keeps `result` on it (empty = none; at most
    /// 16 KiB). Retried like [`Client::ack`]: a retry of an ack that was
    /// committed is answered success and keeps the first result.
    pub async fn ack_with_result(
        &self,
        job_id: u64,
        token: u64,
        result: Vec<u8>,
    ) -> Result<(), ClientError> {
        self.retrying(true, || {
            let mut stub = self.queue();
            let ack = v1::AckRequest { job_id, token, result: result.clone() };
            let request = self.request(ack, self.call_timeout);
            async move { stub.ack(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Fails an attempt. Repeated only after a try that wrote nothing: a
    /// lost answer may have charged it.
    pub async fn nack(&self, request: v1::NackRequest) -> Result<v1::NackResponse, ClientError> {
        self.retrying(false, || {
            let mut stub = self.queue();
            let request = self.request(request.clone(), self.call_timeout);
            async move { stub.nack(request).await }
        })
        .await
    }

    /// Gives a job back without charging an attempt. Retried on transient
    /// failures; when a retry is refused after a try whose answer was lost
    /// (that try may have released the job, which makes the token stale),
    /// the answer is [`ClientError::OutcomeUnknown`], not the refusal.
    pub async fn release(&self, job_id: u64, token: u64) -> Result<(), ClientError> {
        self.retrying_as(Repeat::Differs, || {
            let mut stub = self.queue();
            let request = self.request(v1::ReleaseRequest { job_id, token }, self.call_timeout);
            async move { stub.release(request).await }
        })
        .await
        .map(|_| ())
    }

    /// One job.
    pub async fn get_job(&self, job_id: u64, stale: bool) -> Result<v1::Job, ClientError> {
        let job = self
            .retrying(true, || {
                let mut stub = self.queue();
                let request = self.request(v1::GetJobRequest { job_id, stale }, self.call_timeout);
                async move { stub.get_job(request).await }
            })
            .await?
            .job;
        job.ok_or_else(|| ClientError::Status(tonic::Status::internal("reply carried no job")))
    }

    /// One page of jobs.
    pub async fn list_jobs(
        &self,
        request: v1::ListJobsRequest,
    ) -> Result<v1::ListJobsResponse, ClientError> {
        self.retrying(true, || {
            let mut stub = self.queue();
            let request = self.request(request.clone(), self.call_timeout);
            async move { stub.list_jobs(request).await }
        })
        .await
    }

    /// Queue counts.
    pub async fn stats(
        &self,
        queue: Option<String>,
        stale: bool,
    ) -> Result<v1::StatsResponse, ClientError> {
        self.retrying(true, || {
            let mut stub = self.queue();
            let request =
                self.request(v1::StatsRequest { queue: queue.clone(), stale }, self.call_timeout);
            async move { stub.stats(request).await }
        })
        .await
    }

    /// Dead jobs back to ready.
    pub async fn redrive(&self, request: v1::RedriveRequest) -> Result<u64, ClientError> {
        // A repeat after a try that applied finds nothing dead and answers
        // 0: the count would be wrong, so only a try that never left is
        // repeated.
        self.retrying_as(Repeat::UntilSent, || {
            let mut stub = self.queue();
            let request = self.request(request.clone(), self.call_timeout);
            async move { stub.redrive(request).await }
        })
        .await
        .map(|r| r.redriven)
    }

    /// Cluster status as the answering node sees it, having asked the other
    /// members for their own progress.
    pub async fn status(&self) -> Result<v1::StatusResponse, ClientError> {
        self.retrying(true, || {
            let mut stub = self.cluster();
            let request = self.request(v1::StatusRequest { local_only: false }, self.call_timeout);
            async move { stub.status(request).await }
        })
        .await
    }

    /// Asks node `id` to drain and exit.
    pub async fn drain(&self, id: u64) -> Result<(), ClientError> {
        self.retrying(true, || {
            let mut stub = self.cluster();
            let request = self.request(v1::DrainRequest { id }, self.call_timeout);
            async move { stub.drain(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Changes node `id`'s cutover-gate flags (unset ones keep their
    /// value) and answers them as they now are.
    pub async fn set_flags(
        &self,
        id: u64,
        journal_lease: Option<bool>,
        dry_run: Option<bool>,
    ) -> Result<v1::SetFlagsResponse, ClientError> {
        self.retrying(true, || {
            let mut stub = self.cluster();
            let request =
                self.request(v1::SetFlagsRequest { id, journal_lease, dry_run }, self.call_timeout);
            async move { stub.set_flags(request).await }
        })
        .await
    }

    /// Cluster status as the answering node alone sees it, without asking
    /// the other members (`local_only`): what a probe of one node wants.
    pub async fn local_status(&self) -> Result<v1::StatusResponse, ClientError> {
        self.retrying(true, || {
            let mut stub = self.cluster();
            let request = self.request(v1::StatusRequest { local_only: true }, self.call_timeout);
            async move { stub.status(request).await }
        })
        .await
    }

    /// Adds a node to the cluster (learner first, then voter once caught
    /// up) and answers the leader and the voters after the join. Only nodes
    /// may call it (a node certificate, or a node proof without TLS); it is
    /// here for tools that join nodes, and retried, since joining the same
    /// id at the same address again is a no-op.
    pub async fn join(&self, request: v1::JoinRequest) -> Result<v1::JoinResponse, ClientError> {
        self.retrying(true, || {
            let mut stub = self.cluster();
            let request = self.request(request.clone(), self.call_timeout);
            async move { stub.join(request).await }
        })
        .await
    }

    /// Creates schedule `spec.name`, or replaces its spec (its fired mark
    /// and history stay). Retried: putting the same spec twice is one put.
    pub async fn put_schedule(&self, spec: v1::ScheduleSpec) -> Result<(), ClientError> {
        let message = v1::PutScheduleRequest { spec: Some(spec) };
        self.retrying(true, || {
            let mut stub = self.schedules_stub();
            let request = self.request(message.clone(), self.call_timeout);
            async move { stub.put(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Deletes schedule `name` (NOT_FOUND when there is none). Retried; a
    /// NOT_FOUND on a retry after an unanswered try is
    /// [`ClientError::OutcomeUnknown`]: that try may have deleted it.
    pub async fn delete_schedule(&self, name: &str) -> Result<(), ClientError> {
        let message = v1::DeleteScheduleRequest { name: name.to_string() };
        self.retrying_as(Repeat::Differs, || {
            let mut stub = self.schedules_stub();
            let request = self.request(message.clone(), self.call_timeout);
            async move { stub.delete(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Schedule `name` with its marks, counts, next tick and recent history
    /// (`stale`: from this node's state, without a linearizability check).
    pub async fn get_schedule(&self, name: &str, stale: bool) -> Result<v1::Schedule, ClientError> {
        let message = v1::GetScheduleRequest { name: name.to_string(), stale };
        self.retrying(true, || {
            let mut stub = self.schedules_stub();
            let request = self.request(message.clone(), self.call_timeout);
            async move { stub.get(request).await }
        })
        .await
    }

    /// Every schedule (`stale` as in [`Client::get_schedule`]).
    pub async fn list_schedules(&self, stale: bool) -> Result<Vec<v1::Schedule>, ClientError> {
        self.retrying(true, || {
            let mut stub = self.schedules_stub();
            let request = self.request(v1::ListSchedulesRequest { stale }, self.call_timeout);
            async move { stub.list(request).await }
        })
        .await
        .map(|r| r.schedules)
    }

    /// Pauses schedule `name`: its ticks are recorded as skipped (paused)
    /// until it is resumed. Retried: pausing twice is pausing once.
    pub async fn pause_schedule(&self, name: &str) -> Result<(), ClientError> {
        let message = v1::PauseScheduleRequest { name: name.to_string() };
        self.retrying(true, || {
            let mut stub = self.schedules_stub();
            let request = self.request(message.clone(), self.call_timeout);
            async move { stub.pause(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Resumes schedule `name`. Retried: resuming twice is resuming once.
    pub async fn resume_schedule(&self, name: &str) -> Result<(), ClientError> {
        let message = v1::ResumeScheduleRequest { name: name.to_string() };
        self.retrying(true, || {
            let mut stub = self.schedules_stub();
            let request = self.request(message.clone(), self.call_timeout);
            async move { stub.resume(request).await }
        })
        .await
        .map(|_| ())
    }

    /// Removes a member (learner or voter, the leader included). A retry
    /// refused after a lost answer is [`ClientError::OutcomeUnknown`] (the
    /// lost try may have removed it).
    pub async fn remove_member(&self, id: u64) -> Result<Vec<u64>, ClientError> {
        self.retrying_as(Repeat::Differs, || {
            let mut stub = self.cluster();
            let request = self.request(v1::RemoveRequest { id }, self.call_timeout);
            async move { stub.remove(request).await }
        })
        .await
        .map(|r| r.voters)
    }
}

/// Whether a call may be repeated after a try whose answer was lost, and
/// whether the repeat answers as the first try did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Repeat {
    /// Repeated; a repeat of a try that applied answers the same.
    Same,
    /// Repeated; but a try that applied changes what a repeat is told (a
    /// released token is stale to its retry), so a refused repeat after a
    /// lost answer leaves the outcome unknown.
    Differs,
    /// Repeated only after a try that wrote nothing (it never connected,
    /// or the node refused it before proposing, as in an election): a
    /// repeat of one that applied would answer something else and be taken
    /// for the answer (a redrive's count of jobs moved), or do it twice (an
    /// unkeyed enqueue, a nack that charged an attempt). So such a call
    /// still moves past a node that is down.
    UntilSent,
}

/// The beginnings of a node's UNAVAILABLE answers given before it proposed
/// anything: a draining node's refusal of a claim, no leader to forward
/// to (an election), a clock the voters have not agreed.
const REFUSED_BEFORE_PROPOSING: [&str; 3] = ["draining:", "no leader is known yet", "clock:"];

/// Whether `status` is a node's UNAVAILABLE given before it proposed
/// anything, so nothing of the call was written.
pub fn refused_before_proposing(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable
        && REFUSED_BEFORE_PROPOSING.iter().any(|prefix| status.message().starts_with(prefix))
}

/// The error a call ends with: the last failure, unless an earlier try
/// went unanswered after connecting. Then, if the last was refused by the
/// server and the call is [`Repeat::Differs`], the outcome is unknown; and
/// if the last wrote nothing (it never connected, or the node refused it
/// before proposing), the earlier failure is the one that says what may
/// have happened (a refused connection to the next node, or its "no
/// leader is known yet", does not make the first try unsent).
fn final_error(
    repeat: Repeat,
    in_transit: Option<tonic::Status>,
    last: tonic::Status,
) -> ClientError {
    match in_transit {
        Some(first) if repeat == Repeat::Differs && !is_retryable(&last) => {
            ClientError::OutcomeUnknown { first, last }
        }
        Some(first) if connect_failure(&last) || refused_before_proposing(&last) => {
            ClientError::Status(first)
        }
        _ => ClientError::Status(last),
    }
}

/// A request id no other of this process's requests has: the process id,
/// the time and a counter (the server scopes it by worker or schedule).
/// Set one on a claim before the first try to repeat it yourself (on a new
/// session, or after [`Client::claim_with_wait`] ran out of tries): its
/// repeat gets the first try's leases, not new ones.
pub fn new_request_id() -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:x}-{nanos:x}-{count:x}", std::process::id())
}

/// `host:port` of an address given as `host:port` or `scheme://host:port/`.
/// Whether `addr`'s host is a loopback name or address (`localhost`,
/// `127.0.0.0/8`, `::1`), where a plaintext token stays on the machine.
fn is_loopback(addr: &str) -> bool {
    let host_port = host_port(addr);
    let host = match host_port.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or(rest, |(host, _)| host),
        None => host_port.rsplit_once(':').map_or(host_port, |(host, _)| host),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn host_port(addr: &str) -> &str {
    let addr = addr.trim();
    let addr = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    addr.trim_end_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_token_does_not_cross_the_network_unencrypted() {
        let build = |addr: &str| Client::builder(addr).token("lh_secret").build();
        let refused = build("10.0.0.11:7070").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.contains("unencrypted") && refused.contains("10.0.0.11"), "{refused}");
        assert!(build("http://node-2.example:7070").is_err(), "a name beyond loopback");
        for local in ["127.0.0.1:7070", "127.0.0.2:7070", "localhost:7070", "[::1]:7070"] {
            assert!(build(local).is_ok(), "{local} is loopback");
        }
        let allowed =
            Client::builder("10.0.0.11:7070").token("lh_secret").allow_plaintext_token().build();
        assert!(allowed.is_ok(), "allowed for a node run with --insecure");
        assert!(Client::builder("10.0.0.11:7070").build().is_ok(), "no token, nothing to leak");
        // A user part before `@` is not where the call goes.
        for fooled in ["[::1]@10.0.0.11:7070", "http://127.0.0.1@10.0.0.11:7070"] {
            assert!(build(fooled).is_err(), "{fooled} dials 10.0.0.11");
        }
    }

    #[test]
    fn a_builder_shows_no_credential() {
        let builder = Client::builder("127.0.0.1:7070").token("lh_secret").header("x-proof", "p1");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("lh_secret") && !shown.contains("p1"), "{shown}");
        assert!(shown.contains("authorization") && shown.contains("x-proof"), "{shown}");
    }

    #[tokio::test]
    async fn schemes_are_read_without_regard_to_case_and_unknown_ones_refused() {
        // Upper-case HTTPS is https: without TLS files it is refused, not
        // dialled in plaintext.
        let https = Client::builder("HTTPS://127.0.0.1:7070").build();
        let https = https.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(https.contains("https needs --tls-ca"), "{https}");
        let other = Client::builder("grpc://127.0.0.1:7070").build();
        let other = other.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(other.contains("neither http nor https"), "{other}");
        assert!(Client::builder("HTTP://127.0.0.1:7070").build().is_ok());
    }

    /// A reconnect moves every clone of the client, however made, onto the
    /// fresh client's connections.
    #[tokio::test]
    async fn a_reconnect_moves_every_clone() {
        let client = Client::connect("127.0.0.1:7070").expect("a valid address");
        let clone = client.clone().with_retry(RetryPolicy::default()).follow_leader_hints(false);
        let fresh = Client::connect("127.0.0.1:7071,127.0.0.1:7072").expect("valid addresses");
        client.reconnect(&fresh);
        for moved in [&client, &clone] {
            assert_eq!(moved.connections().addrs, ["127.0.0.1:7071", "127.0.0.1:7072"]);
        }
    }

    #[tokio::test]
    async fn a_leader_hint_moves_the_client_only_to_an_address_it_has() {
        let client = Client::connect("127.0.0.1:7070, http://127.0.0.1:7071/,127.0.0.1:7072")
            .expect("valid addresses");
        let hint = |value: &str| {
            let mut metadata = tonic::metadata::MetadataMap::new();
            metadata.insert(
                leasehold_proto::LEADER_HINT_HEADER,
                value.parse().expect("ascii metadata value"),
            );
            metadata
        };
        let at = |client: &Client| {
            client.current.load(Ordering::Relaxed) % client.connections().nodes.len()
        };
        assert_eq!(at(&client), 0);
        client.follow_leader(&hint("127.0.0.1:7071"));
        assert_eq!(at(&client), 1, "named by host:port, given with a scheme");
        client.follow_leader(&hint("http://127.0.0.1:7072"));
        assert_eq!(at(&client), 2, "named with a scheme, given as host:port");
        client.follow_leader(&hint("10.0.0.9:7070"));
        assert_eq!(at(&client), 2, "an address the client was not given is ignored");
        client.follow_leader(&tonic::metadata::MetadataMap::new());
        assert_eq!(at(&client), 2, "no hint, no move");
        let pinned = client.clone().follow_leader_hints(false);
        pinned.follow_leader(&hint("127.0.0.1:7070"));
        assert_eq!(at(&pinned), 2, "a client told not to follow hints stays");
        client.follow_leader(&hint("127.0.0.1:7070"));
        assert_eq!(at(&client), 0, "the client it was made from follows");
        assert_eq!(at(&pinned), 2, "and does not move the pinned one with it");
    }

    /// Lists the Client method of every RPC; naming a method that does not
    /// exist fails to compile.
    macro_rules! rpc_methods {
        ($($service:literal $rpc:literal => $method:ident),* $(,)?) => {{
            $( let _ = Client::$method; )*
            vec![$(($service, $rpc)),*]
        }};
    }

    /// Every RPC of the Queue, Schedules and Cluster services, read from
    /// the compiled descriptor, has a typed method: a new RPC without one
    /// fails here.
    #[test]
    fn every_public_rpc_has_a_typed_method() {
        use prost::Message as _;
        let covered = rpc_methods! {
            "Queue" "Enqueue" => enqueue,
            "Queue" "Claim" => claim_with_wait,
            "Queue" "Refresh" => refresh,
            "Queue" "Ack" => ack_with_result,
            "Queue" "Nack" => nack,
            "Queue" "Release" => release,
            "Queue" "GetJob" => get_job,
            "Queue" "ListJobs" => list_jobs,
            "Queue" "Stats" => stats,
            "Queue" "Redrive" => redrive,
            "Queue" "Session" => session,
            "Schedules" "Put" => put_schedule,
            "Schedules" "Delete" => delete_schedule,
            "Schedules" "Get" => get_schedule,
            "Schedules" "List" => list_schedules,
            "Schedules" "Pause" => pause_schedule,
            "Schedules" "Resume" => resume_schedule,
            "Schedules" "Trigger" => trigger,
            "Cluster" "Status" => status,
            "Cluster" "Join" => join,
            "Cluster" "Remove" => remove_member,
            "Cluster" "Drain" => drain,
            "Cluster" "SetFlags" => set_flags,
        };
        let descriptors =
            prost_types::FileDescriptorSet::decode(leasehold_proto::FILE_DESCRIPTOR_SET)
                .expect("the build's own descriptor set decodes");
        let mut served = Vec::new();
        for file in &descriptors.file {
            for service in &file.service {
                let name = service.name();
                if !["Queue", "Schedules", "Cluster"].contains(&name) {
                    continue;
                }
                for method in &service.method {
                    served.push((name.to_string(), method.name().to_string()));
                }
            }
        }
        assert!(served.len() >= 20, "descriptor lists the public services: {served:?}");
        for (service, rpc) in &served {
            assert!(
                covered.contains(&(service.as_str(), rpc.as_str())),
                "{service}.{rpc} has no typed method on Client"
            );
        }
        for (service, rpc) in &covered {
            assert!(
                served.iter().any(|(s, r)| s == service && r == rpc),
                "{service}.{rpc} is listed but not in the protos"
            );
        }
    }

    #[test]
    fn only_transient_failures_are_retried() {
        let broken = std::io::Error::other("connection closed before message completed");
        let mut dropped = tonic::Status::cancelled("operation was canceled");
        dropped.set_source(std::sync::Arc::new(std::io::Error::other("connection task ended")));
        let cases = [
            (tonic::Status::unavailable("no leader"), true),
            (tonic::Status::from_error(Box::new(broken)), true),
            (dropped, true),
            (tonic::Status::unknown("the server's own unknown"), false),
            (tonic::Status::cancelled("the server's own cancelled"), false),
            (tonic::Status::failed_precondition("stale fencing token"), false),
            (tonic::Status::invalid_argument("queue: must match"), false),
        ];
        for (status, retryable) in cases {
            assert_eq!(is_retryable(&status), retryable, "{status:?}");
        }
    }

    #[test]
    fn the_tls_files_go_together_or_not_at_all() {
        let ca = std::path::Path::new("ca.pem");
        assert!(matches!(ClientTls::from_optional_files(None, None, None), Ok(None)));
        match ClientTls::from_optional_files(Some(ca), None, None) {
            Err(ClientError::Tls(message)) => {
                assert!(
                    message.contains("--tls-cert") && message.contains("--tls-key"),
                    "{message}"
                );
            }
            other => panic!("one file of three: {other:?}"),
        }
        match ClientTls::from_optional_files(Some(ca), Some(ca), Some(ca)) {
            Err(ClientError::Tls(message)) => {
                assert!(message.contains("--tls-ca ca.pem"), "{message}")
            }
            other => panic!("a missing file: {other:?}"),
        }
    }

    /// `attempts` tries, 10 ms apart.
    fn quick_retries(attempts: u32) -> RetryPolicy {
        let delay = Duration::from_millis(10);
        RetryPolicy { attempts, first_delay: delay, max_delay: delay }
    }

    /// A port of 127.0.0.1 nothing listens on: bound, then let go.
    fn closed_port() -> std::io::Result<u16> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
    }

    #[tokio::test]
    async fn a_refused_connection_sent_nothing_but_a_try_cut_after_connecting_may_have()
    -> Result<(), Box<dyn std::error::Error>> {
        let policy = quick_retries(2);
        let refused = format!("127.0.0.1:{}", closed_port()?);
        let client = Client::connect(&refused)?.with_retry(policy);
        let error = client.status().await.err().ok_or("a closed port answered")?;
        assert!(error.never_sent(), "refused twice: {error:?}");

        // A node that takes the connection, reads the call and dies.
        let (dies, _, server) = dying_node().await?;
        // Its try first, then the refused one: the first may have applied.
        let client = Client::connect(&format!("{dies},{refused}"))?.with_retry(policy);
        let error = client.status().await.err().ok_or("a dying node answered")?;
        server.abort();
        assert!(!error.never_sent(), "the first try reached a node: {error:?}");
        Ok(())
    }

    /// A node that takes each connection, reads the call and dies; answers
    /// its address and how many connections it took.
    async fn dying_node() -> std::io::Result<(String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>)>
    {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let taken = Arc::new(AtomicUsize::new(0));
        let counted = taken.clone();
        let server = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                use tokio::io::AsyncReadExt;
                counted.fetch_add(1, Ordering::SeqCst);
                let mut buffer = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_millis(200), socket.read(&mut buffer))
                    .await;
            }
        });
        Ok((addr, taken, server))
    }

    #[tokio::test]
    async fn a_redrive_cut_after_connecting_is_not_repeated_but_a_refused_one_is()
    -> Result<(), Box<dyn std::error::Error>> {
        let policy = quick_retries(3);
        let (first, _, first_server) = dying_node().await?;
        let (second, second_taken, second_server) = dying_node().await?;
        let request = || v1::RedriveRequest { queue: Some("q".into()), job_ids: Vec::new() };
        // Cut after connecting: its repeat would find nothing dead and say 0.
        let client = Client::connect(&format!("{first},{second}"))?.with_retry(policy);
        let error = client.redrive(request()).await.err().ok_or("a dying node answered")?;
        assert!(!error.never_sent(), "{error:?}");
        assert_eq!(second_taken.load(Ordering::SeqCst), 0, "the redrive was repeated");
        // Refused first: nothing left, so the next address is tried.
        let refused = format!("127.0.0.1:{}", closed_port()?);
        let client = Client::connect(&format!("{refused},{second}"))?.with_retry(policy);
        assert!(client.redrive(request()).await.is_err());
        assert_eq!(second_taken.load(Ordering::SeqCst), 1, "a refused try was not repeated");
        first_server.abort();
        second_server.abort();
        Ok(())
    }

    /// How a [`Repeat::Differs`] call ends whose tries are answered
    /// `answers`, in order.
    async fn differs_after(answers: Vec<tonic::Status>) -> Result<(), ClientError> {
        let client = Client::connect("127.0.0.1:7070")
            .map_err(|e| ClientError::Status(tonic::Status::internal(e.to_string())))?
            .with_retry(quick_retries(3));
        let answers = std::sync::Mutex::new(answers.into_iter());
        client
            .retrying_as(Repeat::Differs, || {
                let next = answers.lock().ok().and_then(|mut answers| answers.next());
                let answer = next.unwrap_or_else(|| tonic::Status::internal("more tries"));
                async move { Err::<tonic::Response<()>, _>(answer) }
            })
            .await
    }

    #[tokio::test]
    async fn a_repeat_refused_after_a_refusal_before_proposing_is_a_plain_refusal() {
        let stale = || tonic::Status::failed_precondition("job 1: token 2 is not current");
        // The first try wrote nothing: the repeat's refusal is the answer.
        let error =
            differs_after(vec![tonic::Status::unavailable("no leader is known yet"), stale()]);
        match error.await {
            Err(ClientError::Status(status)) => {
                assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
            }
            other => panic!("expected the refusal, got {other:?}"),
        }
        // A first try that went unanswered may have applied: unknown.
        let lost = tonic::Status::unavailable("no quorum: not committed within 5000 ms");
        let error = differs_after(vec![lost, stale()]).await;
        assert!(matches!(error, Err(ClientError::OutcomeUnknown { .. })), "{error:?}");
    }

    #[test]
    fn a_nodes_refusals_before_proposing_are_told_from_a_lost_write() {
        let unavailable = tonic::Status::unavailable;
        assert!(refused_before_proposing(&unavailable("draining: this node takes no new claims")));
        assert!(refused_before_proposing(&unavailable("no leader is known yet")));
        assert!(refused_before_proposing(&unavailable("clock: not agreed by a majority")));
        assert!(!refused_before_proposing(&unavailable("no quorum: not committed within 5000 ms")));
        assert!(!refused_before_proposing(&unavailable("leadership is changing")));
        assert!(!refused_before_proposing(&tonic::Status::internal("no leader is known yet")));
    }

    #[test]
    fn a_refused_retry_of_a_call_that_changes_its_own_answer_is_an_unknown_outcome() {
        let lost = || tonic::Status::unavailable("not committed within 5000 ms");
        let stale = || tonic::Status::failed_precondition("stale fencing token 181 for job 144");
        let unknown = final_error(Repeat::Differs, Some(lost()), stale());
        assert!(matches!(unknown, ClientError::OutcomeUnknown { .. }), "{unknown:?}");
        assert_eq!(unknown.code(), tonic::Code::Unknown);
        assert!(unknown.to_string().contains("stale fencing token 181"), "{unknown}");
        // Refused at the first try: nothing was in transit, the refusal holds.
        let refused = final_error(Repeat::Differs, None, stale());
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        // A call whose repeat answers the same keeps the refusal.
        let same = final_error(Repeat::Same, Some(lost()), stale());
        assert_eq!(same.code(), tonic::Code::FailedPrecondition);
        // Out of tries while still in transit: still unavailable.
        let gone = final_error(Repeat::Differs, Some(lost()), lost());
        assert_eq!(gone.code(), tonic::Code::Unavailable);
        // The last try refused a connection: the first's failure stands.
        let refused = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ))));
        assert!(connect_failure(&refused));
        let first = final_error(Repeat::Same, Some(lost()), refused);
        assert!(!first.never_sent(), "{first:?}");
        assert!(first.to_string().contains("not committed"), "{first}");
        // So does a last try the next node refused before proposing.
        let election = tonic::Status::unavailable("no leader is known yet");
        for repeat in [Repeat::Same, Repeat::UntilSent, Repeat::Differs] {
            let first = final_error(repeat, Some(lost()), election.clone());
            match &first {
                ClientError::Status(status) => {
                    assert!(!refused_before_proposing(status), "{repeat:?}: {first:?}")
                }
                other => panic!("{repeat:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn an_unkeyed_enqueue_moves_past_a_node_that_refuses_connections()
    -> Result<(), Box<dyn std::error::Error>> {
        let refused = format!("127.0.0.1:{}", closed_port()?);
        let (dies, taken, server) = dying_node().await?;
        let client = Client::connect(&format!("{refused},{dies}"))?.with_retry(quick_retries(3));
        let unkeyed = v1::JobSpec { queue: "q".into(), ..Default::default() };
        let error = client.enqueue(vec![unkeyed]).await.err().ok_or("a dying node answered")?;
        server.abort();
        assert_eq!(taken.load(Ordering::SeqCst), 1, "the second address was not tried once");
        assert!(!error.never_sent(), "{error:?}");
        Ok(())
    }
}
