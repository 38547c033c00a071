//! The status page: an HTML shell at `/` (with its script and style, all
//! embedded in the binary, so the page needs no network beyond the node)
//! and the JSON it polls at `/api/status`.
//!
//! The JSON is built from the answers of the same service calls the CLI
//! makes — `Cluster.Status`, `Queue.Stats` and `Schedules.List` — called
//! in-process, so the page and `leasehold cluster status` cannot disagree
//! about what they read. The shell carries no data; with a tokens file the
//! JSON needs a token (any role grants the reader's).

mod snapshot;

use axum::http::{HeaderMap, StatusCode, header};
use leasehold_proto::v1;
use leasehold_proto::v1::queue_server::Queue;
use leasehold_proto::v1::schedules_server::Schedules;
use leasehold_security::Role;
use leasehold_security::tokens::SharedTokens;
use serde_json::{Value, json};
use tonic::Request;

use crate::cluster_service::ClusterService;
use crate::queue_service::QueueService;
use crate::schedules_service::SchedulesService;

/// The page's HTML shell.
pub const PAGE_HTML: &str = include_str!("../../assets/status.html");
/// The script that polls `/api/status` and renders it.
pub const PAGE_SCRIPT: &str = include_str!("../../assets/status.js");
/// The page's style.
pub const PAGE_STYLE: &str = include_str!("../../assets/status.css");

/// Where the status JSON comes from, and who may read it.
#[derive(Clone)]
pub struct StatusSources {
    cluster: ClusterService,
    queue: QueueService,
    schedules: SchedulesService,
    tokens: Option<SharedTokens>,
}

/// Why a status request was not answered: its HTTP status and a message
/// for the JSON `error` field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRefusal {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, naming the header or the call.
    pub message: String,
    /// For a refused token, the `reason` label the gRPC side counts such a
    /// refusal under (`no_token`, `unknown_token`, `role`).
    pub auth_reason: Option<&'static str>,
}

impl StatusRefusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        StatusRefusal { status, message: message.into(), auth_reason: None }
    }

    fn unauthorized(reason: &'static str, message: impl Into<String>) -> Self {
        StatusRefusal {
            status: StatusCode::UNAUTHORIZED,
            message: message.into(),
            auth_reason: Some(reason),
        }
    }

    /// The JSON body of the refusal.
    pub fn body(&self) -> Value {
        json!({ "error": self.message })
    }
}

impl StatusSources {
    /// Reads the node's services; with `tokens`, asks every reader for one.
    pub fn new(
        cluster: ClusterService,
        queue: QueueService,
        schedules: SchedulesService,
        tokens: Option<SharedTokens>,
    ) -> Self {
        StatusSources { cluster, queue, schedules, tokens }
    }

    /// Checks the request's bearer token when the node has tokens.
    pub fn authorize(&self, headers: &HeaderMap) -> Result<(), StatusRefusal> {
        authorize(self.tokens.as_ref(), headers)
    }

    /// The status as the page shows it, from the three calls' answers.
    pub async fn snapshot(&self) -> Result<Value, StatusRefusal> {
        let failed = |call: &str, status: tonic::Status| {
            StatusRefusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{call}: {}", status.message()),
            )
        };
        // The page's own turns bound its fan-outs, not Cluster.Status's:
        // callers of the RPC cannot crowd the page out.
        let (cluster, stats, schedules) = tokio::join!(
            self.cluster.gather_status(false),
            self.queue.stats(Request::new(v1::StatsRequest { queue: None, stale: true })),
            self.schedules.list(Request::new(v1::ListSchedulesRequest { stale: true })),
        );
        let stats = stats.map_err(|s| failed("queue stats", s))?.into_inner();
        let schedules = schedules.map_err(|s| failed("schedules list", s))?.into_inner();
        Ok(snapshot::render(&cluster, &stats, &schedules))
    }
}

/// With `tokens`, admits a request whose bearer token is one of them: every
/// role grants the reader's (the status is a read). Without, admits all —
/// as the gRPC services do for a node without a tokens file. A missing,
/// malformed or unknown token is 401.
fn authorize(tokens: Option<&SharedTokens>, headers: &HeaderMap) -> Result<(), StatusRefusal> {
    let Some(tokens) = tokens else {
        return Ok(());
    };
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(StatusRefusal::unauthorized(
            "no_token",
            "authorization: the status needs a bearer token (any role reads it)",
        ));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err(StatusRefusal::unauthorized(
            "no_token",
            "authorization: expected \"Bearer TOKEN\"",
        ));
    };
    match tokens.current().authenticate(token) {
        Some(entry) if entry.grants(Role::Reader) => Ok(()),
        Some(entry) => Err(StatusRefusal::unauthorized(
            "role",
            format!("authorization: token {:?} does not grant the reader role", entry.name),
        )),
        None => Err(StatusRefusal::unauthorized("unknown_token", "authorization: unknown token")),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use axum::http::HeaderValue;
    use leasehold_security::tokens::{TokenSet, toml_entry};

    use super::*;

    fn tokens() -> SharedTokens {
        let text = format!(
            "{}{}",
            toml_entry("watcher", &[Role::Reader], "reader-secret"),
            toml_entry("runner", &[Role::Worker], "worker-secret")
        );
        let set = TokenSet::from_toml(&text, Path::new("tokens.toml")).expect("a valid file");
        SharedTokens::new(set)
    }

    fn bearer(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).expect("ascii"));
        headers
    }

    #[test]
    fn without_tokens_anyone_reads() {
        assert_eq!(authorize(None, &HeaderMap::new()), Ok(()));
    }

    #[test]
    fn any_known_token_reads_and_anything_else_is_401_naming_the_header() {
        let tokens = tokens();
        assert_eq!(authorize(Some(&tokens), &bearer("Bearer reader-secret")), Ok(()));
        assert_eq!(authorize(Some(&tokens), &bearer("Bearer worker-secret")), Ok(()));
        for (headers, problem) in [
            (HeaderMap::new(), "needs a bearer token"),
            (bearer("Basic reader-secret"), "expected \"Bearer TOKEN\""),
            (bearer("Bearer "), "expected \"Bearer TOKEN\""),
            (bearer("Bearer reader-secre"), "unknown token"),
        ] {
            let refusal = authorize(Some(&tokens), &headers).expect_err("refused");
            assert_eq!(refusal.status, StatusCode::UNAUTHORIZED, "{headers:?}");
            assert!(refusal.message.starts_with("authorization: "), "{}", refusal.message);
            assert!(refusal.message.contains(problem), "{}", refusal.message);
            assert_eq!(refusal.body()["error"], json!(refusal.message));
        }
    }
}
