//! The HTTP side of a node: `/livez` (process up), `/readyz` (safe to
//! schedule; the body names each check), `/metrics` (OpenMetrics text,
//! which Prometheus scrapes natively), and the status page — its shell at
//! `/` and the JSON it polls at `/api/status` (see [`crate::status`]).

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use leasehold_replica::Readiness;
use leasehold_replica::metrics::AuthLabels;
use std::sync::Arc;
use tokio::sync::Semaphore;

use crate::status::{PAGE_HTML, PAGE_SCRIPT, PAGE_STYLE, StatusSources};

pub mod listener;

/// The `service` label of a status page request's refusal in
/// `leasehold_auth_refused_total`.
const STATUS_PAGE_SERVICE: &str = "http.status";

/// Status answers computed at once; more wait their turn. Each fans out a
/// status call to every member, so many open pages must not multiply that.
const MAX_STATUS_IN_FLIGHT: usize = 4;
/// How long an authorized status request waits for its turn before it is
/// answered 503: the page polls every second and tries again.
const STATUS_TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What the HTTP handlers read.
#[derive(Clone)]
struct Http {
    readiness: Readiness,
    status: StatusSources,
    /// Turns at computing a status answer, taken once the caller is known.
    status_turns: Arc<Semaphore>,
}

/// Serves the HTTP endpoints on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    readiness: Readiness,
    status: StatusSources,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/", get(|| async { asset("text/html; charset=utf-8", PAGE_HTML) }))
        .route("/status.js", get(|| async { asset("text/javascript; charset=utf-8", PAGE_SCRIPT) }))
        .route("/status.css", get(|| async { asset("text/css; charset=utf-8", PAGE_STYLE) }))
        .route("/api/status", get(api_status))
        .with_state(Http {
            readiness,
            status,
            status_turns: Arc::new(Semaphore::new(MAX_STATUS_IN_FLIGHT)),
        });
    let app = if listener.local_addr()?.ip().is_loopback() {
        app.layer(axum::middleware::from_fn(loopback_hosts_only))
    } else {
        app
    };
    let (connections, failure) = listener::Bounded::new(listener)?;
    tokio::select! {
        () = serve_connections(connections, app, shutdown) => Ok(()),
        Ok(error) = failure => {
            tracing::error!(%error, "the HTTP port stopped accepting connections");
            Err(error)
        }
    }
}

/// How long a client may take to send a request's headers, counted from
/// when hyper starts reading them (on a kept-alive connection, right after
/// the previous answer, so an idle kept-alive connection is closed after
/// this too): a client that trickles them (a byte now and then, which the
/// listener's idle close never sees as idle) is closed after this.
const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long open connections may finish their answers once the node stops.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves `app` on every connection until `shutdown` resolves, then lets
/// open connections finish what they are answering for a moment. This is
/// axum's own `serve` with two changes: hyper is given a timer, without
/// which its header-read timeout does nothing, and it speaks HTTP/1 only.
async fn serve_connections(
    mut connections: listener::Bounded,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    use axum::serve::Listener;
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let (stop, stopping) = tokio::sync::watch::channel(());
    let mut open = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (io, remote) = tokio::select! {
            accepted = connections.accept() => accepted,
            () = &mut shutdown => break,
        };
        while open.try_join_next().is_some() {}
        // Each request knows the connection's client, for refusal logs.
        let with_client = tower::ServiceExt::map_request(app.clone(), client_of(remote));
        let service = TowerToHyperService::new(with_client);
        let mut stopping = stopping.clone();
        open.spawn(async move {
            // HTTP/1 only: probes, scrapers and browsers speak it on a
            // plain port, and HTTP/2 has no header-read timeout, so a
            // client could hold a connection with a frame now and then.
            let mut builder = Builder::new(TokioExecutor::new()).http1_only();
            builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
            let connection = builder.serve_connection(TokioIo::new(io), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = stopping.changed() => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
    }
    // Refuse new connections at once, rather than accept them unserved.
    drop(connections);
    drop(stop);
    let _ =
        tokio::time::timeout(SHUTDOWN_GRACE, async { while open.join_next().await.is_some() {} })
            .await;
}

/// Marks each request with the connection's client address, which
/// axum's `ConnectInfo` extractor reads.
fn client_of<B>(
    remote: std::net::SocketAddr,
) -> impl FnMut(axum::http::Request<B>) -> axum::http::Request<B> + Clone {
    move |mut request| {
        request.extensions_mut().insert(axum::extract::ConnectInfo(remote));
        request
    }
}

/// On a port bound to loopback, answers only requests addressed to a
/// loopback name (`localhost`, `127.0.0.0/8`, `::1`), except `/livez`. A
/// web page the operator visits can rebind its own host name to
/// 127.0.0.1 and read this port as its own origin (DNS rebinding); its
/// requests still name that host, so they are refused, with 421.
async fn loopback_hosts_only(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host =
        request.uri().authority().map(|authority| authority.host().to_string()).or_else(|| {
            // A Host that does not parse names no loopback either.
            let value = request.headers().get(header::HOST)?;
            Some(value.to_str().ok().and_then(host_of).unwrap_or_else(|| "(unreadable)".into()))
        });
    match host {
        Some(host) if !is_loopback_name(&host) && request.uri().path() != "/livez" => (
            StatusCode::MISDIRECTED_REQUEST,
            [(header::CACHE_CONTROL, "no-store")],
            format!(
                "this port is bound to loopback and answers requests for a loopback name only, \
                 not for host {}\n",
                host.chars().take(64).collect::<String>()
            ),
        )
            .into_response(),
        _ => next.run(request).await,
    }
}

/// The host part of a `Host` header's value (without its port).
fn host_of(value: &str) -> Option<String> {
    let authority: axum::http::uri::Authority = value.parse().ok()?;
    Some(authority.host().to_string())
}

/// Whether `host` (as in a URI, IPv6 in brackets) names this machine's
/// loopback interface.
fn is_loopback_name(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An embedded asset. The shell carries no data, and nothing of it may be
/// framed by another site or guessed as another type.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
        ],
        body,
    )
        .into_response()
}

async fn api_status(State(http): State<Http>, request: axum::http::request::Parts) -> Response {
    let headers = &request.headers;
    let no_store = [(header::CACHE_CONTROL, "no-store")];
    // The token before a turn: a caller without one takes none.
    let answer = match http.status.authorize(headers) {
        Ok(()) => match tokio::time::timeout(STATUS_TURN_WAIT, http.status_turns.acquire()).await {
            Ok(Ok(_turn)) => http.status.snapshot().await,
            _ => {
                let busy = serde_json::json!({ "error": "busy: too many status requests at once" });
                return (StatusCode::SERVICE_UNAVAILABLE, no_store, Json(busy)).into_response();
            }
        },
        Err(refusal) => Err(refusal),
    };
    match answer {
        Ok(body) => (StatusCode::OK, no_store, Json(body)).into_response(),
        Err(refusal) => {
            if let Some(reason) = refusal.auth_reason {
                // Counted and logged as the gRPC side's refusals are, so
                // tokens tried against the page show where operators look.
                let labels = AuthLabels {
                    service: STATUS_PAGE_SERVICE.to_string(),
                    reason: reason.to_string(),
                };
                http.readiness.journal().metrics().auth_refused.get_or_create(&labels).inc();
                let client = request
                    .extensions
                    .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                    .map(|info| info.0.to_string())
                    .unwrap_or_default();
                tracing::info!(
                    event = "auth.refuse",
                    method = "GET /api/status",
                    reason,
                    %client,
                    message = %refusal.message,
                    "status request refused"
                );
            }
            let mut response = (refusal.status, no_store, Json(refusal.body())).into_response();
            if refusal.status == StatusCode::UNAUTHORIZED {
                // Bearer, not Basic: a browser must not pop up its own dialog.
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
            }
            response
        }
    }
}

async fn metrics(
    State(http): State<Http>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let journal = http.readiness.journal();
    journal.refresh_gauges().await;
    // prometheus-client encodes the OpenMetrics text format (counter families
    // declared without `_total`, a closing `# EOF`); labelled as the classic
    // text/plain 0.0.4 format, a scraper would read every counter as untyped.
    let content_type =
        [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")];
    match journal.metrics().encode() {
        Ok(text) => (StatusCode::OK, content_type, text),
        Err(error) => (StatusCode::INTERNAL_SERVER_ERROR, content_type, error.to_string()),
    }
}

async fn readyz(State(http): State<Http>) -> (StatusCode, String) {
    let report = http.readiness.report().await;
    let code = if report.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, report.body())
}

#[cfg(test)]
mod host_tests {
    use super::{host_of, is_loopback_name};

    #[test]
    fn only_loopback_names_pass() {
        for host in ["localhost:7080", "LOCALHOST", "127.0.0.1:7080", "127.3.4.5", "[::1]:7080"] {
            let name = host_of(host).expect("a host");
            assert!(is_loopback_name(&name), "{host}");
        }
        for host in
            ["attacker.example:7080", "10.0.0.1", "[::2]:7080", "localhost.attacker.example"]
        {
            let name = host_of(host).expect("a host");
            assert!(!is_loopback_name(&name), "{host}");
        }
        assert_eq!(host_of("not a host"), None);
    }
}
