//! The node's one HTTP listener: probes, metrics, the JSON API and the dashboard.
//!
//! - `GET /healthz`: 200 while the runtime answers. `GET /readyz`: 200 once the node has an
//!   etcd session and stands in every shard election, else 503 with the reason (also while a
//!   run lately could not start for want of file descriptors).
//! - `GET /metrics`: Prometheus metrics.
//! - `GET /api/v1/status`, `/api/v1/jobs`, `/api/v1/jobs/{name}` (one job),
//!   `/api/v1/jobs/{name}/history`, `/api/v1/jobs/{name}/runs/{tick}` (one run, with its
//!   output), `/api/v1/jobs/{name}/backfill` (its progress), `/api/v1/plan`: reads, open to
//!   whoever reaches the listener unless a read token is set. `POST
//!   /api/v1/jobs/{name}/trigger|pause|resume|backfill|backfill/cancel`: writes, with
//!   `Authorization: Bearer TOKEN` (see `api`).
//! - `GET /`: the dashboard, a page served from the binary that reads and writes through the API;
//!   `GET /jobs/{name}`: a job's page (its history, a timeline, each run's output).
//!
//! `listener` bounds the clients (a connection cap, header and idle timeouts); `guard` checks
//! every request's `Host`, adds the security headers and makes every error JSON.

mod api;
mod exposure;
mod failed_tokens;
mod guard;
mod index;
mod listener;
mod reads;

use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::coord::keys::Keys;
use crate::rules::config::Cluster;

use crate::readiness::Readiness;

pub(crate) use exposure::Exposed;
pub use exposure::Exposure;
pub use listener::{connection_cap, DEFAULT_MAX_CONNECTIONS};

const DASHBOARD: &str = include_str!("dashboard.html");
const DASHBOARD_SCRIPT: &str = include_str!("dashboard.js");
const DASHBOARD_STYLE: &str = include_str!("dashboard.css");
const COMMON_SCRIPT: &str = include_str!("common.js");
const JOB_PAGE: &str = include_str!("job.html");
/// What `/jobs/{name}` shows for a job the node's config does not have.
const NO_JOB_PAGE: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>No such job - shardcron</title><link rel=\"stylesheet\" href=\"/dashboard.css\"></head><body><main><h1>No such job</h1><p>This node's jobs.toml has no job of that name: <a href=\"/\">back to the dashboard</a>, or <code>shardcron check</code> lists the jobs.</p></main></body></html>\n";
const JOB_SCRIPT: &str = include_str!("job.js");

/// What the listener serves from.
pub struct Served {
    pub cluster: Cluster,
    pub readiness: Readiness,
    /// The running node's etcd client and jobs, once it has them.
    pub exposure: Exposure,
    /// The bearer token writes need; `None` turns writes off (403).
    pub token: Option<String>,
    /// The bearer token reads need (the write token also grants them); `None` leaves reads
    /// open. Probes and `/metrics` never need one.
    pub read_token: Option<String>,
    /// The most connections open at once; see [`connection_cap`].
    pub max_connections: usize,
    /// Host names (with or without a port) requests may name besides the listen address and
    /// loopback; any other `Host` is answered 421, which stops DNS rebinding.
    pub allowed_hosts: Vec<String>,
}

/// What the handlers share: what the listener serves from, and what it keeps between
/// requests.
pub(crate) struct App {
    served: Served,
    /// The address the listener is bound to, a `Host` every request may name.
    listen: SocketAddr,
    reads: reads::Reads,
    /// The jobs by name, built once per config load.
    jobs: index::JobIndex,
    /// Who sent wrong tokens lately, to count, log and slow them.
    failed_tokens: failed_tokens::FailedTokens,
}

impl Deref for App {
    type Target = Served;

    fn deref(&self) -> &Served {
        &self.served
    }
}

/// Serves the listener until `stop`. Started before the node connects to etcd, so probes and
/// metrics answer while it waits, and stopped after the node ended, so `/readyz` says
/// "stopping" for as long as it drains.
pub async fn serve(listener: TcpListener, served: Served, stop: CancellationToken) {
    let listen = match listener.local_addr() {
        Ok(listen) => listen,
        Err(err) => {
            tracing::error!(error = %err, "the HTTP listener has no address");
            return;
        }
    };
    let cap = served.max_connections.max(1);
    let app = Arc::new(App {
        served,
        listen,
        reads: reads::Reads::default(),
        jobs: index::JobIndex::default(),
        failed_tokens: failed_tokens::FailedTokens::new(),
    });
    listener::run(listener, router(app), cap, stop).await;
}

fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/dashboard.js", get(dashboard_script))
        .route("/dashboard.css", get(dashboard_style))
        .route("/common.js", get(|| async { script(COMMON_SCRIPT) }))
        .route("/job.js", get(|| async { script(JOB_SCRIPT) }))
        .route("/jobs/{name}", get(api::job_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/status", get(api::status))
        .route("/api/v1/jobs", get(api::jobs))
        .route("/api/v1/activity", get(api::activity))
        .route("/api/v1/plan", get(api::plan))
        .route("/api/v1/jobs/{name}", get(api::job))
        .route("/api/v1/jobs/{name}/history", get(api::history))
        .route("/api/v1/jobs/{name}/runs/{tick}", get(api::run))
        .route("/api/v1/jobs/{name}/trigger", post(api::trigger))
        .route("/api/v1/jobs/{name}/pause", post(api::pause))
        .route("/api/v1/jobs/{name}/resume", post(api::resume))
        .route(
            "/api/v1/jobs/{name}/backfill",
            post(api::backfill).get(api::backfill_progress),
        )
        .route("/api/v1/jobs/{name}/backfill/cancel", post(api::cancel_backfill))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&app), guard::guard))
        .with_state(app)
}

impl Served {
    fn keys(&self) -> Keys {
        Keys::new(&self.cluster.name)
    }
}

async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD)
}

async fn dashboard_script() -> Response {
    script(DASHBOARD_SCRIPT)
}

fn script(text: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], text).into_response()
}

async fn dashboard_style() -> Response {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], DASHBOARD_STYLE).into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(axum::extract::State(app): axum::extract::State<Arc<App>>) -> Response {
    if let Some(reason) = app.readiness.not_ready() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")).into_response();
    }
    // A node in its elections whose runs cannot start would keep its shards and run nothing:
    // an orchestrator should hear about it.
    match crate::running::descriptors::recent_exhaustion() {
        Some(ago) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "out of file descriptors: a run could not start {} s ago (EMFILE/ENFILE); see shardcron_spawn_descriptor_exhausted_total\n",
                ago.as_secs()
            ),
        )
            .into_response(),
        None => (StatusCode::OK, "ready\n").into_response(),
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
    api::Failure::new(
        StatusCode::NOT_FOUND,
        "not found: try GET /, /healthz, /readyz, /metrics or /api/v1/status",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::http::Request;
    use tower_service::Service;

    use super::*;

    fn app(read_token: Option<&str>) -> Router {
        let served = Served {
            cluster: Cluster {
                name: "test".to_string(),
                shards: 1,
                lease_ttl: std::time::Duration::from_secs(2),
                timezone: chrono_tz::UTC,
                history: 10,
                pool_shards: 16,
            },
            readiness: Readiness::default(),
            exposure: Exposure::default(),
            token: Some("the write token, long enough".to_string()),
            read_token: read_token.map(str::to_string),
            max_connections: 8,
            allowed_hosts: Vec::new(),
        };
        router(Arc::new(App {
            served,
            listen: "127.0.0.1:9464".parse().unwrap(),
            reads: reads::Reads::default(),
            jobs: index::JobIndex::default(),
            failed_tokens: failed_tokens::FailedTokens::new(),
        }))
    }

    async fn status_of(router: &mut Router, path: &str, token: Option<&str>) -> StatusCode {
        let mut request = Request::get(path).header(header::HOST, "127.0.0.1:9464");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        router
            .call(request.body(Body::empty()).unwrap())
            .await
            .unwrap()
            .status()
    }

    async fn status_from(router: &mut Router, peer: [u8; 4], path: &str, token: Option<&str>) -> StatusCode {
        let mut request = Request::get(path).header(header::HOST, "127.0.0.1:9464");
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let mut request = request.body(Body::empty()).unwrap();
        request
            .extensions_mut()
            .insert(listener::PeerAddr(std::net::IpAddr::from(peer)));
        router.call(request).await.unwrap().status()
    }

    /// Wrong tokens are counted, and a peer that keeps sending them waits longer for each
    /// answer; its probes and other peers do not.
    #[tokio::test(start_paused = true)]
    async fn wrong_tokens_are_counted_and_slow_only_their_peer() {
        let mut guarded = app(Some("the read token, long enough"));
        let counted = || {
            let page = crate::metrics::get().render();
            page.lines()
                .find_map(|line| line.strip_prefix("shardcron_http_unauthorized_total "))
                .and_then(|value| value.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let before = counted();
        let guesser = [192, 0, 2, 7];
        let mut last = std::time::Duration::ZERO;
        for _ in 0..9 {
            let started = tokio::time::Instant::now();
            assert_eq!(
                status_from(&mut guarded, guesser, "/api/v1/status", Some("a guess")).await,
                StatusCode::UNAUTHORIZED
            );
            last = started.elapsed();
        }
        assert!(counted() >= before + 9, "{} then {}", before, counted());
        assert!(
            last >= std::time::Duration::from_millis(800),
            "the 9th guess waited {last:?}"
        );
        let started = tokio::time::Instant::now();
        assert_eq!(
            status_from(&mut guarded, guesser, "/healthz", None).await,
            StatusCode::OK
        );
        assert_eq!(
            status_from(
                &mut guarded,
                [192, 0, 2, 8],
                "/api/v1/status",
                Some("the read token, long enough")
            )
            .await,
            StatusCode::SERVICE_UNAVAILABLE,
            "another peer with the right token: past the check"
        );
        assert!(
            started.elapsed() < std::time::Duration::from_millis(50),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_read_token_guards_reads_but_not_probes_or_metrics() {
        let reads = [
            "/api/v1/status",
            "/api/v1/jobs",
            "/api/v1/plan",
            "/api/v1/jobs/a/history",
        ];
        let mut open = app(None);
        for path in reads {
            // No etcd behind this router: a read that passed its check finds the node
            // not connected.
            assert_eq!(
                status_of(&mut open, path, None).await,
                StatusCode::SERVICE_UNAVAILABLE,
                "{path}"
            );
        }
        let mut guarded = app(Some("the read token, long enough"));
        for path in reads {
            assert_eq!(
                status_of(&mut guarded, path, None).await,
                StatusCode::UNAUTHORIZED,
                "{path}"
            );
            assert_eq!(
                status_of(&mut guarded, path, Some("a wrong token")).await,
                StatusCode::UNAUTHORIZED,
                "{path}"
            );
            for token in ["the read token, long enough", "the write token, long enough"] {
                assert_eq!(
                    status_of(&mut guarded, path, Some(token)).await,
                    StatusCode::SERVICE_UNAVAILABLE,
                    "{path} with {token}"
                );
            }
        }
        assert_eq!(status_of(&mut guarded, "/healthz", None).await, StatusCode::OK);
        assert_eq!(status_of(&mut guarded, "/metrics", None).await, StatusCode::OK);
        assert_eq!(
            status_of(&mut guarded, "/", None).await,
            StatusCode::OK,
            "the page itself asks for the token"
        );
        assert_eq!(
            status_of(&mut guarded, "/readyz", None).await,
            StatusCode::SERVICE_UNAVAILABLE,
            "starting"
        );
    }
}
