//! The HTTP side of a node: `/livez` (process up) and `/readyz` (safe to
//! schedule; the body names each check).

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use tokio::net::TcpListener;

use crate::readiness::Readiness;

/// Serves the HTTP endpoints on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    readiness: Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(readiness);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

async fn readyz(State(readiness): State<Readiness>) -> (StatusCode, String) {
    let report = readiness.report().await;
    let code = if report.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, report.body())
}
