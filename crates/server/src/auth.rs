//! Who may call what: every gRPC call passes [`AuthLayer`] before any
//! service sees it.
//!
//! The layer names the caller ([`Caller`]) from the connection and the
//! call's metadata, then checks the call's method against one table
//! ([`requirement`]):
//!
//! - the internal services (Raft, Peer, and Cluster.Join) take only nodes:
//!   with TLS, a certificate naming `leasehold://node/ID`; without TLS, a
//!   valid node proof (`leasehold-node-proof`, keyed by the cluster secret).
//!   A client certificate or a client token never reaches them;
//! - the public services take a node, or a client whose bearer token holds
//!   the method's role when the node has a tokens file (without one, every
//!   client that reached the port may call them: the loopback default);
//! - health is open, so probes need nothing.
//!
//! What depends on a call's body (a command queue needs `admin`) is checked
//! by the service with [`Caller::require`], against the same roles. A
//! refused call changes nothing: it never reaches a service.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use leasehold_security::secret::NODE_PROOF_HEADER;
use leasehold_security::{ClusterSecret, Identity, Role, SharedTokens};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::incoming::ConnectionInfo;
use leasehold_replica::metrics::AuthLabels;

/// Who made a call, as established by [`AuthLayer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// A cluster node (by certificate, or by node proof without TLS).
    Node(u64),
    /// A client. `roles` is `None` when the node has no tokens file: every
    /// client may do everything (the loopback default).
    Client {
        /// The token's name, or the certificate's, for messages and logs.
        name: String,
        /// What the token may do.
        roles: Option<Vec<Role>>,
    },
}

impl Caller {
    /// Whether this caller may do what `role` allows.
    pub fn may(&self, role: Role) -> bool {
        match self {
            Caller::Node(_) => true,
            Caller::Client { roles: None, .. } => true,
            Caller::Client { roles: Some(roles), .. } => roles.iter().any(|r| r.grants(role)),
        }
    }

    /// PERMISSION_DENIED unless this caller may do what `role` allows;
    /// `what` says what was asked ("enqueue on command queue exec").
    pub fn require(&self, role: Role, what: &str) -> Result<(), tonic::Status> {
        if self.may(role) {
            return Ok(());
        }
        Err(tonic::Status::permission_denied(format!(
            "{what} needs the {role} role; {}",
            self.describe_roles()
        )))
    }

    /// The node id, for a node.
    pub fn node_id(&self) -> Option<u64> {
        match self {
            Caller::Node(id) => Some(*id),
            Caller::Client { .. } => None,
        }
    }

    fn describe_roles(&self) -> String {
        match self {
            Caller::Node(id) => format!("node {id} may do anything"),
            Caller::Client { name, roles: Some(roles) } => {
                let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
                format!("token {name:?} has {}", names.join(","))
            }
            Caller::Client { name, roles: None } => format!("client {name:?} has every role"),
        }
    }

    /// The node that made `request`, and whether its certificate named it
    /// (TLS) rather than its node proof; PERMISSION_DENIED for a client
    /// (the layer already keeps clients off node-only methods).
    pub fn node_of<T>(request: &tonic::Request<T>) -> Result<(u64, bool), tonic::Status> {
        let caller = Caller::of(request)?;
        let Some(id) = caller.node_id() else {
            return Err(tonic::Status::permission_denied("this call is for cluster nodes only"));
        };
        let by_certificate =
            request.extensions().get::<ConnectionInfo>().is_some_and(|connection| connection.tls);
        Ok((id, by_certificate))
    }

    /// The caller of a tonic request, as the layer recorded it. A request
    /// that did not pass the layer has none, and is refused.
    pub fn of<T>(request: &tonic::Request<T>) -> Result<&Caller, tonic::Status> {
        request
            .extensions()
            .get::<Caller>()
            .ok_or_else(|| tonic::Status::internal("no caller identity on this call"))
    }
}

/// What a method asks of its caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// Anyone (health probes).
    Open,
    /// A cluster node only.
    Node,
    /// A node, or a client holding this role.
    Role(Role),
}

/// The requirement of the method at gRPC path `path`
/// (`/package.Service/Method`). Every method a node serves has a row; any
/// other path needs `admin`, so a method added without a row is closed,
/// not open to every known caller.
pub fn requirement(path: &str) -> Requirement {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let service = parts.next().unwrap_or_default();
    let method = parts.next().unwrap_or_default();
    match (service, method) {
        ("grpc.health.v1.Health", _) => Requirement::Open,
        ("grpc.reflection.v1.ServerReflection", _)
        | ("grpc.reflection.v1alpha.ServerReflection", _) => Requirement::Role(Role::Reader),
        ("leasehold.v1.Raft", _) | ("leasehold.v1.Peer", _) => Requirement::Node,
        ("leasehold.v1.Cluster", "Join") => Requirement::Node,
        ("leasehold.v1.Cluster", "Remove" | "Drain" | "SetFlags") => Requirement::Role(Role::Admin),
        ("leasehold.v1.Cluster", "Status") => Requirement::Role(Role::Reader),
        // Command queues need admin on top; the service checks the body.
        ("leasehold.v1.Queue", "Enqueue" | "Redrive") => Requirement::Role(Role::Producer),
        ("leasehold.v1.Queue", "Claim" | "Refresh" | "Ack" | "Nack" | "Release") => {
            Requirement::Role(Role::Worker)
        }
        // Every frame of a session is checked against its own call's row
        // above; opening one needs only a known caller.
        ("leasehold.v1.Queue", "Session") => Requirement::Role(Role::Reader),
        ("leasehold.v1.Queue", "GetJob" | "ListJobs" | "Stats") => Requirement::Role(Role::Reader),
        ("leasehold.v1.Schedules", "Get" | "List") => Requirement::Role(Role::Reader),
        ("leasehold.v1.Schedules", "Put" | "Delete" | "Pause" | "Resume" | "Trigger") => {
            Requirement::Role(Role::Admin)
        }
        ("leasehold.v1.Faults", _) => Requirement::Role(Role::Admin),
        _ => Requirement::Role(Role::Admin),
    }
}

/// The services a node may serve, by gRPC name (Faults only with fault
/// injection on).
pub const SERVICES: [&str; 9] = [
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
    "leasehold.v1.Cluster",
    "leasehold.v1.Faults",
    "leasehold.v1.Peer",
    "leasehold.v1.Queue",
    "leasehold.v1.Raft",
    "leasehold.v1.Schedules",
];

/// Longest path a refusal repeats in its log line or its message: longer
/// than every method a node serves, so only a made-up path is cut. A
/// client may send a path of kilobytes once and then name it again in a
/// byte or two (HTTP/2 header compression), so an uncut path would let it
/// write a thousand bytes of log for every byte it sends.
const SHOWN_PATH_BYTES: usize = 128;

/// `path`, cut to [`SHOWN_PATH_BYTES`] at a character boundary.
fn shown(path: &str) -> &str {
    let mut end = path.len().min(SHOWN_PATH_BYTES);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    path.get(..end).unwrap_or_default()
}

/// The `service` label of a refusal of the call at `path`: the service's
/// name, or `other` for a name no node serves. The path comes from the
/// caller, so it never becomes a label of its own (each would be a series
/// kept for the life of the process).
fn service_label(path: &str) -> &'static str {
    let service = path.trim_start_matches('/').split('/').next().unwrap_or_default();
    SERVICES.iter().find(|known| **known == service).copied().unwrap_or("other")
}

/// The credentials a node checks.
#[derive(Clone)]
pub struct AuthConfig {
    /// Connections are TLS: identities come from certificates only.
    pub tls: bool,
    /// The cluster secret, for node proofs when there is no TLS.
    pub secret: ClusterSecret,
    /// Client tokens; `None` when the node has no tokens file.
    pub tokens: Option<SharedTokens>,
}

/// A refusal: its status, and a short label for the metric.
struct Refusal {
    status: tonic::Status,
    reason: &'static str,
}

fn refuse(reason: &'static str, status: tonic::Status) -> Refusal {
    Refusal { status, reason }
}

impl AuthConfig {
    /// The caller of a call at `path` with `headers` on `connection`, or
    /// why the call is refused.
    fn admit(
        &self,
        path: &str,
        headers: &http::HeaderMap,
        connection: Option<&ConnectionInfo>,
    ) -> Result<Caller, Refusal> {
        let method = shown(path.trim_start_matches('/'));
        let needed = requirement(path);
        let identity = connection.and_then(|c| c.identity.as_ref());
        // With TLS only a certificate makes a node; without, a node proof.
        let node = if self.tls {
            identity.and_then(Identity::node_id)
        } else {
            headers
                .get(NODE_PROOF_HEADER)
                .and_then(|value| value.to_str().ok())
                .and_then(|proof| self.secret.verify_node_proof(proof))
        };
        if let Some(id) = node {
            return Ok(Caller::Node(id));
        }
        match needed {
            Requirement::Open => {
                return Ok(Caller::Client { name: "anonymous".into(), roles: Some(Vec::new()) });
            }
            Requirement::Node if self.tls => {
                let who = identity.map(|i| i.to_string()).unwrap_or_else(|| "the caller".into());
                return Err(refuse(
                    "not_a_node",
                    tonic::Status::permission_denied(format!(
                        "{method} is for cluster nodes only: {who} has a client certificate \
                         (a node's certificate names leasehold://node/ID)"
                    )),
                ));
            }
            Requirement::Node => {
                let problem = if headers.contains_key(NODE_PROOF_HEADER) {
                    "does not verify"
                } else {
                    "is missing"
                };
                return Err(refuse(
                    "node_proof",
                    tonic::Status::unauthenticated(format!(
                        "{method} is for cluster nodes only: {NODE_PROOF_HEADER} {problem} \
                         (every node of a cluster needs the same cluster_secret)"
                    )),
                ));
            }
            Requirement::Role(_) => {}
        }
        let Some(tokens) = &self.tokens else {
            let name = identity.map(|i| i.to_string()).unwrap_or_else(|| "anonymous".into());
            return Ok(Caller::Client { name, roles: None });
        };
        let Some(value) = headers.get(http::header::AUTHORIZATION) else {
            return Err(refuse(
                "no_token",
                tonic::Status::unauthenticated(format!(
                    "authorization: {method} needs a bearer token (--token or LEASEHOLD_TOKEN)"
                )),
            ));
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
        let Some(token) = token.map(str::trim).filter(|t| !t.is_empty()) else {
            return Err(refuse(
                "no_token",
                tonic::Status::unauthenticated("authorization: expected \"Bearer TOKEN\""),
            ));
        };
        let set = tokens.current();
        let Some(entry) = set.authenticate(token) else {
            return Err(refuse(
                "unknown_token",
                tonic::Status::unauthenticated("authorization: unknown token"),
            ));
        };
        let caller = Caller::Client { name: entry.name.clone(), roles: Some(entry.roles.clone()) };
        if let Requirement::Role(role) = needed
            && !caller.may(role)
        {
            return Err(refuse(
                "role",
                tonic::Status::permission_denied(format!(
                    "{method} needs the {role} role; token {:?} has {}",
                    entry.name,
                    entry.role_names()
                )),
            ));
        }
        Ok(caller)
    }
}

/// The tower layer that admits or refuses every call.
#[derive(Clone)]
pub struct AuthLayer {
    config: Arc<AuthConfig>,
    refused: Family<AuthLabels, Counter>,
}

impl AuthLayer {
    /// A layer checking `config`, counting refusals in `refused`.
    pub fn new(config: AuthConfig, refused: Family<AuthLabels, Counter>) -> AuthLayer {
        AuthLayer { config: Arc::new(config), refused }
    }

    /// Counts and logs a refusal of a call at `path` from `remote`.
    fn record(&self, path: &str, refusal: &Refusal, remote: Option<SocketAddr>) {
        self.refused
            .get_or_create(&AuthLabels {
                service: service_label(path).to_string(),
                reason: refusal.reason.to_string(),
            })
            .inc();
        let remote = remote.map(|r| r.to_string()).unwrap_or_default();
        tracing::info!(
            event = "auth.refuse",
            method = %shown(path),
            reason = refusal.reason,
            client = %remote,
            message = %refusal.status.message(),
            "call refused"
        );
    }

    /// Counts and logs a service's own refusal of a call at `path` for
    /// its role (a command queue needs admin), as [`Self::record`] does
    /// the layer's refusals.
    fn record_role(&self, path: &str, status: &tonic::Status) {
        self.refused
            .get_or_create(&AuthLabels {
                service: service_label(path).to_string(),
                reason: "role".to_string(),
            })
            .inc();
        tracing::info!(
            event = "auth.refuse",
            method = %shown(path),
            reason = "role",
            message = %status.message(),
            "call refused"
        );
    }
}

/// The gRPC path of the worker session, whose frames are admitted one by
/// one ([`Readmission`]).
pub const SESSION_PATH: &str = "/leasehold.v1.Queue/Session";

/// The credentials of a long-lived call (a worker session), kept so that
/// each of its frames is admitted as a call of its own: [`AuthLayer`]
/// puts one on every `Queue.Session` call, and [`Readmission::admit`]
/// checks the frame's method against the tokens in force now — a token
/// removed by a reload stops working on the sessions it opened too — with
/// the layer's own rules, counting and logging.
#[derive(Clone)]
pub struct Readmission {
    layer: AuthLayer,
    headers: http::HeaderMap,
    connection: Option<ConnectionInfo>,
}

impl Readmission {
    /// The caller of a frame that is a call at `path`
    /// (`/leasehold.v1.Queue/Ack`), or the status refusing it.
    pub fn admit(&self, path: &str) -> Result<Caller, tonic::Status> {
        self.layer.config.admit(path, &self.headers, self.connection.as_ref()).map_err(|refusal| {
            self.layer.record(path, &refusal, self.connection.as_ref().and_then(|c| c.remote));
            refusal.status
        })
    }

    /// Counts and logs a handler's refusal of a frame at `path` for its
    /// role, as the layer does a call's.
    pub fn record_role_refusal(&self, path: &str, status: &tonic::Status) {
        self.layer.record_role(path, status);
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth { inner, layer: self.clone() }
    }
}

/// [`AuthLayer`]'s service.
#[derive(Clone)]
pub struct Auth<S> {
    inner: S,
    layer: AuthLayer,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B> tower::Service<http::Request<B>> for Auth<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let path = request.uri().path().to_string();
        let admitted = self.layer.config.admit(
            &path,
            request.headers(),
            request.extensions().get::<ConnectionInfo>(),
        );
        match admitted {
            Ok(caller) => {
                request.extensions_mut().insert(caller);
                if path == SESSION_PATH {
                    let readmission = Readmission {
                        layer: self.layer.clone(),
                        headers: request.headers().clone(),
                        connection: request.extensions().get::<ConnectionInfo>().cloned(),
                    };
                    request.extensions_mut().insert(readmission);
                }
                // The service that was made ready is the one that serves.
                let ready = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, ready);
                let future = inner.call(request);
                let layer = self.layer.clone();
                Box::pin(async move {
                    let response = future.await?;
                    // A service's own role check (a command queue needs
                    // admin) is counted and logged like the layer's.
                    if let Some(status) = tonic::Status::from_header_map(response.headers())
                        && status.code() == tonic::Code::PermissionDenied
                    {
                        layer.record_role(&path, &status);
                    }
                    Ok(response)
                })
            }
            Err(refusal) => {
                let remote = request.extensions().get::<ConnectionInfo>().and_then(|c| c.remote);
                self.layer.record(&path, &refusal, remote);
                let response = refusal.status.into_http();
                Box::pin(async move { Ok(response) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_security::tokens::{TokenSet, toml_entry};

    fn secret() -> ClusterSecret {
        ClusterSecret::from_text("a cluster secret for the tests").expect("long enough")
    }

    fn tokens() -> SharedTokens {
        let text = [
            toml_entry("ops", &[Role::Admin], "t-admin"),
            toml_entry("bot", &[Role::Producer], "t-producer"),
            toml_entry("w", &[Role::Worker], "t-worker"),
            toml_entry("r", &[Role::Reader], "t-reader"),
        ]
        .join("\n");
        SharedTokens::new(
            TokenSet::from_toml(&text, std::path::Path::new("t")).expect("valid tokens"),
        )
    }

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (key, value) in pairs {
            map.insert(
                http::HeaderName::from_bytes(key.as_bytes()).expect("header name"),
                value.parse().expect("header value"),
            );
        }
        map
    }

    fn code(result: &Result<Caller, Refusal>) -> tonic::Code {
        match result {
            Ok(_) => tonic::Code::Ok,
            Err(refusal) => refusal.status.code(),
        }
    }

    /// Just enough of protobuf's descriptor messages to list the methods
    /// of the services the node's descriptor set declares.
    #[derive(Clone, PartialEq, prost::Message)]
    struct FileSet {
        #[prost(message, repeated, tag = "1")]
        file: Vec<File>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct File {
        #[prost(string, optional, tag = "2")]
        package: Option<String>,
        #[prost(message, repeated, tag = "6")]
        service: Vec<Service>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Service {
        #[prost(string, optional, tag = "1")]
        name: Option<String>,
        #[prost(message, repeated, tag = "2")]
        method: Vec<Method>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    struct Method {
        #[prost(string, optional, tag = "1")]
        name: Option<String>,
    }

    #[test]
    fn a_refusal_repeats_at_most_a_short_path() {
        let long = format!("/leasehold.v1.Queue/{}", "é".repeat(4_000));
        let cut = shown(&long);
        assert!(cut.len() <= SHOWN_PATH_BYTES && cut.len() + 2 > SHOWN_PATH_BYTES, "{}", cut.len());
        assert!(long.starts_with(cut));
        for service in SERVICES {
            let path = format!("/{service}/SomeLongMethodNameOfTheService");
            assert_eq!(shown(&path), path, "a served path is never cut");
        }
    }

    #[test]
    fn every_method_has_the_requirement_security_md_gives_it_and_others_need_admin() {
        use prost::Message;
        let set = FileSet::decode(leasehold_proto::FILE_DESCRIPTOR_SET).expect("descriptors");
        let (admin, producer, worker, reader) = (
            Requirement::Role(Role::Admin),
            Requirement::Role(Role::Producer),
            Requirement::Role(Role::Worker),
            Requirement::Role(Role::Reader),
        );
        // docs/security.md, "Roles".
        let expected = |service: &str, method: &str| match (service, method) {
            ("Raft" | "Peer", _) | ("Cluster", "Join") => Requirement::Node,
            ("Cluster", "Remove" | "Drain" | "SetFlags") | ("Faults", _) => admin,
            ("Schedules", "Put" | "Delete" | "Pause" | "Resume" | "Trigger") => admin,
            ("Queue", "Enqueue" | "Redrive") => producer,
            ("Queue", "Claim" | "Refresh" | "Ack" | "Nack" | "Release") => worker,
            ("Queue", "GetJob" | "ListJobs" | "Stats" | "Session")
            | ("Schedules", "Get" | "List")
            | ("Cluster", "Status") => reader,
            _ => panic!("no role given in security.md for {service}.{method}: add one"),
        };
        let mut methods = 0;
        for file in &set.file {
            for service in &file.service {
                let name = service.name.clone().unwrap_or_default();
                for method in &service.method {
                    let method = method.name.clone().unwrap_or_default();
                    let path =
                        format!("/{}.{name}/{method}", file.package.clone().unwrap_or_default());
                    assert_eq!(requirement(&path), expected(&name, &method), "{path}");
                    methods += 1;
                }
            }
        }
        assert!(methods >= 30, "only {methods} methods in the descriptor set");
        assert_eq!(requirement("/grpc.health.v1.Health/Check"), Requirement::Open);
        assert_eq!(
            requirement("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            reader
        );
        for unlisted in ["/leasehold.v1.Queue/Purge", "/leasehold.v1.Cluster/Wipe", "/x.Y/Z", ""] {
            assert_eq!(requirement(unlisted), admin, "{unlisted}");
        }
    }

    #[test]
    fn a_refusal_is_labelled_by_a_served_service_or_other() {
        assert_eq!(service_label("/leasehold.v1.Queue/Enqueue"), "leasehold.v1.Queue");
        assert_eq!(service_label("/grpc.health.v1.Health/Check"), "grpc.health.v1.Health");
        // A caller's made-up service is one label, whatever its name.
        assert_eq!(service_label("/rand1234.X/Y"), "other");
        assert_eq!(service_label(&format!("/{}/Y", "a".repeat(10_000))), "other");
        assert_eq!(service_label(""), "other");
    }

    #[test]
    fn without_tls_only_a_node_proof_reaches_the_internal_services() {
        let config = AuthConfig { tls: false, secret: secret(), tokens: Some(tokens()) };
        let proof = secret().node_proof(2);
        let forged =
            ClusterSecret::from_text("some other cluster's secret").expect("ok").node_proof(2);
        for path in [
            "/leasehold.v1.Raft/AppendEntries",
            "/leasehold.v1.Raft/Vote",
            "/leasehold.v1.Raft/InstallSnapshot",
            "/leasehold.v1.Raft/Forward",
            "/leasehold.v1.Peer/Advertise",
            "/leasehold.v1.Peer/Bus",
            "/leasehold.v1.Cluster/Join",
        ] {
            let node = config.admit(path, &headers(&[(NODE_PROOF_HEADER, &proof)]), None);
            assert_eq!(node.as_ref().ok(), Some(&Caller::Node(2)), "{path}");
            let none = config.admit(path, &headers(&[]), None);
            assert_eq!(code(&none), tonic::Code::Unauthenticated, "{path}");
            let wrong = config.admit(path, &headers(&[(NODE_PROOF_HEADER, &forged)]), None);
            assert_eq!(code(&wrong), tonic::Code::Unauthenticated, "{path}");
            let admin = config.admit(path, &headers(&[("authorization", "Bearer t-admin")]), None);
            assert_eq!(code(&admin), tonic::Code::Unauthenticated, "a token never reaches {path}");
        }
    }

    #[test]
    fn with_tls_a_client_certificate_never_reaches_the_internal_services() {
        let config = AuthConfig { tls: true, secret: secret(), tokens: Some(tokens()) };
        let client = ConnectionInfo {
            remote: None,
            identity: Some(Identity::Client("client".into())),
            tls: true,
        };
        let node = ConnectionInfo { identity: Some(Identity::Node(3)), ..client.clone() };
        let proof = secret().node_proof(3);
        let path = "/leasehold.v1.Raft/AppendEntries";
        let refused = config.admit(
            path,
            &headers(&[(NODE_PROOF_HEADER, &proof), ("authorization", "Bearer t-admin")]),
            Some(&client),
        );
        assert_eq!(
            code(&refused),
            tonic::Code::PermissionDenied,
            "the proof does not count with TLS"
        );
        let admitted = config.admit(path, &headers(&[]), Some(&node));
        assert_eq!(admitted.ok(), Some(Caller::Node(3)));
    }

    #[test]
    fn tokens_carry_roles_and_each_method_needs_its_own() {
        let config = AuthConfig { tls: false, secret: secret(), tokens: Some(tokens()) };
        let call = |path: &str, token: Option<&str>| {
            let bearer = token.map(|t| format!("Bearer {t}"));
            let pairs: Vec<(&str, &str)> =
                bearer.as_deref().map(|b| vec![("authorization", b)]).unwrap_or_default();
            code(&config.admit(path, &headers(&pairs), None))
        };
        use tonic::Code::{Ok, PermissionDenied, Unauthenticated};
        let cases = [
            ("/leasehold.v1.Queue/Enqueue", "t-producer", Ok),
            ("/leasehold.v1.Queue/Enqueue", "t-worker", PermissionDenied),
            ("/leasehold.v1.Queue/Enqueue", "t-reader", PermissionDenied),
            ("/leasehold.v1.Queue/Claim", "t-worker", Ok),
            ("/leasehold.v1.Queue/Ack", "t-producer", PermissionDenied),
            ("/leasehold.v1.Queue/Stats", "t-reader", Ok),
            ("/leasehold.v1.Queue/Stats", "t-worker", Ok),
            ("/leasehold.v1.Queue/Redrive", "t-producer", Ok),
            ("/leasehold.v1.Schedules/Put", "t-producer", PermissionDenied),
            ("/leasehold.v1.Schedules/Put", "t-admin", Ok),
            ("/leasehold.v1.Schedules/List", "t-reader", Ok),
            ("/leasehold.v1.Schedules/Trigger", "t-worker", PermissionDenied),
            ("/leasehold.v1.Cluster/Status", "t-reader", Ok),
            ("/leasehold.v1.Cluster/Remove", "t-producer", PermissionDenied),
            ("/leasehold.v1.Cluster/Drain", "t-admin", Ok),
            ("/leasehold.v1.Cluster/SetFlags", "t-worker", PermissionDenied),
            ("/leasehold.v1.Cluster/Join", "t-admin", Unauthenticated),
            ("/leasehold.v1.Faults/SetClock", "t-producer", PermissionDenied),
            ("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "t-reader", Ok),
            ("/leasehold.v1.Queue/Stats", "nope", Unauthenticated),
        ];
        for (path, token, expected) in cases {
            assert_eq!(call(path, Some(token)), expected, "{path} with {token}");
        }
        assert_eq!(call("/leasehold.v1.Queue/Stats", None), Unauthenticated);
        assert_eq!(call("/grpc.health.v1.Health/Check", None), Ok, "health is open");
        let message = config
            .admit(
                "/leasehold.v1.Schedules/Put",
                &headers(&[("authorization", "Bearer t-worker")]),
                None,
            )
            .err()
            .map(|r| r.status.message().to_string())
            .unwrap_or_default();
        assert!(message.contains("admin") && message.contains("\"w\""), "{message}");
    }

    #[test]
    fn without_a_tokens_file_clients_may_do_everything_but_the_internal_calls() {
        let config = AuthConfig { tls: false, secret: secret(), tokens: None };
        let open = config.admit("/leasehold.v1.Schedules/Put", &headers(&[]), None);
        assert!(open.as_ref().is_ok_and(|c| c.may(Role::Admin)));
        let internal = config.admit("/leasehold.v1.Raft/Vote", &headers(&[]), None);
        assert_eq!(code(&internal), tonic::Code::Unauthenticated);
    }

    #[test]
    fn a_body_check_names_what_was_asked_and_the_roles_held() {
        let producer = Caller::Client { name: "bot".into(), roles: Some(vec![Role::Producer]) };
        let status = producer.require(Role::Admin, "enqueue on command queue exec").err();
        let message = status.as_ref().map(|s| s.message().to_string()).unwrap_or_default();
        assert_eq!(status.map(|s| s.code()), Some(tonic::Code::PermissionDenied));
        assert!(
            message.contains("command queue exec") && message.contains("producer"),
            "{message}"
        );
        assert!(Caller::Node(1).require(Role::Admin, "x").is_ok());
    }
}
