//! The node's one HTTP listener: probes, metrics, the JSON API and the dashboard.
//!
//! - `GET /healthz`: 200 while the runtime answers. `GET /readyz`: 200 once the node has an
//!   etcd session and stands in every shard election, else 503 with the reason.
//! - `GET /metrics`: Prometheus metrics.
//! - `GET /api/v1/status`, `/api/v1/jobs/{name}/history`, `/api/v1/plan`: reads, open to
//!   whoever reaches the listener. `POST /api/v1/jobs/{name}/trigger|pause|resume`: writes, with
//!   `Authorization: Bearer TOKEN` (see `api`).
//! - `GET /`: the dashboard, a page served from the binary that reads and writes through the API.

mod api;

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Cluster;
use crate::keys::Keys;
use crate::node::Exposure;
use crate::readiness::Readiness;

const DASHBOARD: &str = include_str!("dashboard.html");

/// What the listener serves from.
pub struct Served {
    pub cluster: Cluster,
    pub readiness: Readiness,
    /// The running node's etcd client and jobs, once it has them.
    pub exposure: Exposure,
    /// The bearer token writes need; `None` turns writes off (403).
    pub token: Option<String>,
}

/// Serves the listener until `stop`. Started before the node connects to etcd, so probes and
/// metrics answer while it waits, and stopped after the node ended, so `/readyz` says
/// "stopping" for as long as it drains.
pub async fn serve(listener: TcpListener, served: Served, stop: CancellationToken) {
    let app = router(Arc::new(served));
    if let Err(err) = axum::serve(listener, app)
        .with_graceful_shutdown(stop.cancelled_owned())
        .await
    {
        tracing::error!(error = %err, "the HTTP listener failed");
    }
}

fn router(served: Arc<Served>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/status", get(api::status))
        .route("/api/v1/plan", get(api::plan))
        .route("/api/v1/jobs/{name}/history", get(api::history))
        .route("/api/v1/jobs/{name}/trigger", post(api::trigger))
        .route("/api/v1/jobs/{name}/pause", post(api::pause))
        .route("/api/v1/jobs/{name}/resume", post(api::resume))
        .fallback(not_found)
        .with_state(served)
}

impl Served {
    fn keys(&self) -> Keys {
        Keys::new(&self.cluster.name)
    }
}

async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD)
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(axum::extract::State(served): axum::extract::State<Arc<Served>>) -> Response {
    match served.readiness.not_ready() {
        None => (StatusCode::OK, "ready\n").into_response(),
        Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response(),
    }
}

async fn metrics() -> Response {
    // With many jobs a page is large; building it must not hold up a runtime thread that fires
    // ticks.
    let page = tokio::task::spawn_blocking(|| crate::metrics::get().render())
        .await
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        page,
    )
        .into_response()
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        "not found: try GET /, /healthz, /readyz, /metrics or /api/v1/status\n",
    )
        .into_response()
}
