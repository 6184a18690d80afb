//! The JSON API: the reads and writes of `status`, `history`, `plan`, `trigger`, `pause` and
//! `resume`, with the same semantics as those commands.
//!
//! Every error is `{"error": "..."}` with a status that says what to do next: 400 fix the
//! request, 401 send the right token, 403 writes are off on this node, 404 no such job, 503 the
//! node has no etcd connection yet or etcd failed (retry), 504 no leader took a run in time.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::Served;
use crate::config::Job;
use crate::node::Exposed;

/// An answer that is not a success.
pub(super) struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let mut response = (self.0, Json(json!({ "error": self.1 }))).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        response
    }
}

pub(super) type Answer = Result<Response, Failure>;

fn etcd_failed(err: impl std::fmt::Display) -> Failure {
    Failure(StatusCode::SERVICE_UNAVAILABLE, format!("etcd: {err}"))
}

fn bad_request(message: impl Into<String>) -> Failure {
    Failure(StatusCode::BAD_REQUEST, message.into())
}

impl Served {
    fn exposed(&self) -> Result<&Exposed, Failure> {
        self.exposure.get().ok_or_else(|| {
            Failure(
                StatusCode::SERVICE_UNAVAILABLE,
                "the node is not connected to etcd yet".to_string(),
            )
        })
    }

    /// Writes need `Authorization: Bearer TOKEN` with the token of `--api-token-env`.
    fn authorize(&self, headers: &HeaderMap) -> Result<(), Failure> {
        let Some(token) = &self.token else {
            return Err(Failure(
                StatusCode::FORBIDDEN,
                "writes are disabled on this node: start it with --api-token-env VAR, VAR holding the token"
                    .to_string(),
            ));
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        match given {
            Some(given) if same_secret(given.trim().as_bytes(), token.as_bytes()) => Ok(()),
            Some(_) => Err(Failure(StatusCode::UNAUTHORIZED, "wrong token".to_string())),
            None => Err(Failure(
                StatusCode::UNAUTHORIZED,
                "writes need an Authorization: Bearer TOKEN header".to_string(),
            )),
        }
    }
}

impl Served {
    /// What a write to job `name` needs first: the token, a connected node, the job, and the
    /// request's body.
    fn write_to_job<T: serde::de::DeserializeOwned + Default>(
        &self,
        headers: &HeaderMap,
        name: &str,
        bytes: &Bytes,
    ) -> Result<(&Exposed, T), Failure> {
        self.authorize(headers)?;
        let exposed = self.exposed()?;
        known_job(exposed, name)?;
        Ok((exposed, body(bytes)?))
    }
}

/// Compares in time that depends on the lengths only, so an answer's timing does not tell how
/// much of a guess was right.
fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    given.len() == secret.len() && given.iter().zip(secret).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
}

/// The node's jobs, by name.
fn jobs_by_name(exposed: &Exposed) -> Vec<Arc<Job>> {
    let loaded = exposed.jobs.borrow().clone();
    let mut jobs: Vec<Arc<Job>> = loaded.by_shard.iter().flatten().cloned().collect();
    jobs.sort_by(|a, b| a.name.cmp(&b.name));
    jobs
}

fn known_job(exposed: &Exposed, name: &str) -> Result<(), Failure> {
    let loaded = exposed.jobs.borrow();
    if loaded.by_shard.iter().flatten().any(|job| job.name == name) {
        Ok(())
    } else {
        Err(Failure(
            StatusCode::NOT_FOUND,
            format!("no job {name:?} in this node's jobs.toml"),
        ))
    }
}

/// `GET /api/v1/status`: the document of `status --json`.
pub(super) async fn status(State(served): State<Arc<Served>>) -> Answer {
    let exposed = served.exposed()?;
    let jobs = jobs_by_name(exposed);
    let digest = exposed.jobs.borrow().digest.clone();
    let jobs: Vec<&Job> = jobs.iter().map(Arc::as_ref).collect();
    let status = crate::status::read(&served.cluster, &digest, &jobs, &exposed.client)
        .await
        .map_err(etcd_failed)?;
    Ok(Json(status).into_response())
}

#[derive(Deserialize)]
pub(super) struct HistoryQuery {
    count: Option<usize>,
}

/// `GET /api/v1/jobs/{name}/history?count=N`: the job's newest runs, newest first.
pub(super) async fn history(
    State(served): State<Arc<Served>>,
    Path(name): Path<String>,
    Query(query): Query<HistoryQuery>,
) -> Answer {
    let exposed = served.exposed()?;
    if served.cluster.history == 0 {
        return Err(Failure(
            StatusCode::NOT_FOUND,
            "this cluster keeps no history ([cluster] history = 0)".to_string(),
        ));
    }
    let count = query.count.unwrap_or(20).min(served.cluster.history as usize);
    let records = crate::history::read(&exposed.client, &served.keys(), &name, count)
        .await
        .map_err(etcd_failed)?;
    if records.is_empty() {
        known_job(exposed, &name)?;
    }
    Ok(Json(records).into_response())
}

#[derive(Deserialize)]
pub(super) struct PlanQuery {
    #[serde(rename = "for")]
    length: Option<String>,
    from: Option<String>,
    job: Option<String>,
    limit: Option<usize>,
}

/// The most fires one plan answer lists.
const PLAN_LIMIT: usize = 10_000;

/// `GET /api/v1/plan?for=24h[&from=RFC3339][&job=NAME][&limit=N]`: the lines of `plan --json`.
pub(super) async fn plan(State(served): State<Arc<Served>>, Query(query): Query<PlanQuery>) -> Answer {
    let exposed = served.exposed()?;
    let from = match &query.from {
        Some(from) => DateTime::parse_from_rfc3339(from)
            .map_err(|err| bad_request(format!("from={from:?} is not an RFC 3339 instant: {err}")))?
            .with_timezone(&Utc),
        None => Utc::now(),
    };
    let length = match &query.length {
        Some(length) => humantime::parse_duration(length)
            .map_err(|err| bad_request(format!("for={length:?} is not a duration such as 24h: {err}")))?,
        None => Duration::from_secs(24 * 3600),
    };
    let to = chrono::Duration::from_std(length)
        .ok()
        .and_then(|length| from.checked_add_signed(length))
        .ok_or_else(|| bad_request("the window is too long"))?;
    if let Some(job) = &query.job {
        known_job(exposed, job)?;
    }
    let limit = query.limit.unwrap_or(PLAN_LIMIT).min(PLAN_LIMIT);
    let jobs = jobs_by_name(exposed);
    let fires = tokio::task::spawn_blocking(move || {
        let jobs: Vec<&Job> = jobs
            .iter()
            .map(Arc::as_ref)
            .filter(|job| query.job.as_ref().is_none_or(|wanted| *wanted == job.name))
            .collect();
        let (fires, cut) = crate::plan::fires(&jobs, from, to, limit);
        let fires: Vec<crate::plan::PlannedFire> = fires.iter().map(crate::plan::PlannedFire::from).collect();
        serde_json::to_value(json!({ "fires": fires, "cut": cut }))
    })
    .await
    .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?
    .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
    Ok(Json(fires).into_response())
}

/// A write's body: JSON or nothing.
fn body<T: serde::de::DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, Failure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|err| bad_request(format!("the body is not the JSON expected: {err}")))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct TriggerBody {
    /// How long a leader has to take the run (default 10 s), as `shardcron trigger --timeout`.
    timeout: Option<String>,
    /// Answer when the run ended, with its record, as `trigger --wait`.
    #[serde(default)]
    wait: bool,
}

/// `POST /api/v1/jobs/{name}/trigger`: 202 once a leader took the run, or with `"wait": true`
/// 200 with the run's record once it ended.
pub(super) async fn trigger(
    State(served): State<Arc<Served>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Answer {
    let (exposed, asked): (_, TriggerBody) = served.write_to_job(&headers, &name, &bytes)?;
    let timeout = match &asked.timeout {
        Some(timeout) => humantime::parse_duration(timeout)
            .map_err(|err| bad_request(format!("timeout {timeout:?} is not a duration such as 10s: {err}")))?,
        None => Duration::from_secs(10),
    };
    let keys = served.keys();
    let claimed = crate::triggers::ask(&exposed.client, &keys, &name, timeout)
        .await
        .map_err(etcd_failed)?
        .ok_or_else(|| {
            Failure(
                StatusCode::GATEWAY_TIMEOUT,
                format!("no leader took the run of {name} within {timeout:?}; the request was withdrawn"),
            )
        })?;
    tracing::info!(job = %name, node = %claimed.node, fence = claimed.fence, "run asked for through the API");
    let taken = json!({ "job": name, "node": claimed.node, "fence": claimed.fence, "id": claimed.id });
    if !asked.wait {
        crate::triggers::forget(&exposed.client, &keys, &claimed.id)
            .await
            .map_err(etcd_failed)?;
        return Ok((StatusCode::ACCEPTED, Json(taken)).into_response());
    }
    let run = crate::triggers::wait_for_run(&exposed.client, &keys, &claimed)
        .await
        .map_err(etcd_failed)?
        .ok_or_else(|| {
            Failure(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "node {} left the fleet and did not report the end of the run",
                    claimed.node
                ),
            )
        })?;
    Ok(
        Json(json!({ "job": name, "node": claimed.node, "fence": claimed.fence, "id": claimed.id, "run": run }))
            .into_response(),
    )
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct PauseBody {
    until: Option<DateTime<Utc>>,
    #[serde(rename = "for")]
    length: Option<String>,
    reason: Option<String>,
}

/// `POST /api/v1/jobs/{name}/pause` with `{"until": RFC 3339}` or `{"for": "1h"}` and an
/// optional `"reason"`; neither: until resumed.
pub(super) async fn pause(
    State(served): State<Arc<Served>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Answer {
    let (exposed, asked): (_, PauseBody) = served.write_to_job(&headers, &name, &bytes)?;
    let length = asked
        .length
        .as_deref()
        .map(humantime::parse_duration)
        .transpose()
        .map_err(|err| bad_request(format!("for is not a duration such as 1h: {err}")))?;
    let pause = crate::pauses::Pause::asked(Utc::now(), asked.until, length, asked.reason)
        .map_err(|refused| bad_request(refused.to_string()))?;
    crate::pauses::pause(&exposed.client, &served.keys(), std::slice::from_ref(&name), &pause)
        .await
        .map_err(etcd_failed)?;
    tracing::info!(job = %name, until = ?pause.until, reason = ?pause.reason, "paused through the API");
    Ok(Json(json!({ "job": name, "paused": pause })).into_response())
}

/// `POST /api/v1/jobs/{name}/resume`: ends the job's pause; `"resumed": false` if none held.
pub(super) async fn resume(State(served): State<Arc<Served>>, Path(name): Path<String>, headers: HeaderMap) -> Answer {
    served.authorize(&headers)?;
    let exposed = served.exposed()?;
    let ended = crate::pauses::resume(
        &exposed.client,
        &served.keys(),
        Some(std::slice::from_ref(&name)),
        Utc::now(),
    )
    .await
    .map_err(etcd_failed)?;
    if ended.is_empty() {
        known_job(exposed, &name)?;
    } else {
        tracing::info!(job = %name, "resumed through the API");
    }
    Ok(Json(json!({ "job": name, "resumed": !ended.is_empty() })).into_response())
}
