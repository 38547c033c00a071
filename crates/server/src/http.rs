//! The HTTP side of a node: `/livez` (process up), `/readyz` (safe to
//! schedule; the body names each check) and `/metrics` (OpenMetrics text,
//! which Prometheus scrapes natively).

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;

use leasehold_replica::Readiness;

/// Serves the HTTP endpoints on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    readiness: Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(readiness);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

async fn metrics(
    State(readiness): State<Readiness>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let journal = readiness.journal();
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

async fn readyz(State(readiness): State<Readiness>) -> (StatusCode, String) {
    let report = readiness.report().await;
    let code = if report.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, report.body())
}
