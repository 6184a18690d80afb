//! The JSON API: the reads and writes of `status`, `history`, `plan`, `trigger`, `pause` and
//! `resume`, with the same semantics as those commands.
//!
//! Every error is `{"error": "..."}` with a status that says what to do next: 400 fix the
//! request, 401 send the right token, 403 writes are off on this node, 404 no such job, 413 the
//! body is too large, 421 the `Host` is not this listener's, 503 the node has no etcd
//! connection yet, etcd failed or too many reads run at once (retry), 504 no leader took a run
//! in time.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::{App, Served};
use crate::config::Job;
use crate::node::Exposed;

/// An answer that is not a success.
pub(super) struct Failure(StatusCode, String);

impl Failure {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Failure {
        Failure(status, message.into())
    }
}

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
        match bearer(headers) {
            Some(given) if same_secret(given.as_bytes(), token.as_bytes()) => Ok(()),
            Some(_) => Err(Failure(StatusCode::UNAUTHORIZED, "wrong token".to_string())),
            None => Err(Failure(
                StatusCode::UNAUTHORIZED,
                "writes need an Authorization: Bearer TOKEN header".to_string(),
            )),
        }
    }

    /// Reads need the read token, or the write token, once a read token is set.
    fn authorize_read(&self, headers: &HeaderMap) -> Result<(), Failure> {
        let Some(read_token) = &self.read_token else {
            return Ok(());
        };
        let given = bearer(headers).ok_or_else(|| {
            Failure(
                StatusCode::UNAUTHORIZED,
                "reads on this node need an Authorization: Bearer TOKEN header with the read token".to_string(),
            )
        })?;
        // Both compared, whichever matches: the time taken does not tell which one was tried.
        let reads = same_secret(given.as_bytes(), read_token.as_bytes());
        let writes = self
            .token
            .as_ref()
            .is_some_and(|token| same_secret(given.as_bytes(), token.as_bytes()));
        if reads | writes {
            Ok(())
        } else {
            Err(Failure(StatusCode::UNAUTHORIZED, "wrong token".to_string()))
        }
    }
}

/// The token of an `Authorization: Bearer TOKEN` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
}

impl Served {
    /// What a write to job `name` needs first: the token, a connected node, the job, and the
    /// request's body, read only once the token passed.
    async fn write_to_job<T: serde::de::DeserializeOwned + Default>(
        &self,
        headers: &HeaderMap,
        name: &str,
        body: Body,
    ) -> Result<(&Exposed, T), Failure> {
        self.authorize(headers)?;
        let exposed = self.exposed()?;
        known_job(exposed, name)?;
        let bytes = read_body(body).await?;
        Ok((exposed, parse_body(&bytes)?))
    }
}

/// The largest body a write takes: its fields are a duration, a flag, an instant and a reason
/// of at most [`crate::pauses::MAX_REASON`] bytes.
const BODY_LIMIT: usize = 16 * 1024;
/// How long a client has to send a write's body.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

async fn read_body(body: Body) -> Result<Bytes, Failure> {
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, BODY_LIMIT)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(Failure(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {BODY_LIMIT} bytes, or broken off"),
        )),
        Err(_) => Err(Failure(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body did not arrive within {BODY_TIMEOUT:?}"),
        )),
    }
}

/// `*` names every job in etcd's pause keys (`pause --all`); through the API it is no job,
/// for every verb.
fn no_wildcard(name: &str) -> Result<(), Failure> {
    if name == crate::pauses::EVERY_JOB {
        return Err(Failure(
            StatusCode::NOT_FOUND,
            "no job \"*\": the API acts on one job at a time".to_string(),
        ));
    }
    Ok(())
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

#[derive(Deserialize)]
pub(super) struct StatusQuery {
    /// `false` leaves the jobs out: nodes and shards only, which the dashboard reads while
    /// it pages through the jobs with `/api/v1/jobs`.
    jobs: Option<bool>,
}

/// `GET /api/v1/status[?jobs=false]`: the document of `status --json`, at most a second old.
pub(super) async fn status(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(query): Query<StatusQuery>,
) -> Answer {
    app.authorize_read(&headers)?;
    let exposed = app.exposed()?;
    let with_jobs = query.jobs.unwrap_or(true);
    let body = app
        .reads
        .status(with_jobs, async {
            let jobs = if with_jobs { jobs_by_name(exposed) } else { Vec::new() };
            let digest = exposed.jobs.borrow().digest.clone();
            let status = crate::status::read_document(&app.cluster, &digest, jobs, &exposed.client)
                .await
                .map_err(etcd_failed)?;
            // Tens of megabytes at 100,000 jobs: not on a runtime thread that fires ticks.
            tokio::task::spawn_blocking(move || serde_json::to_vec(&status))
                .await
                .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?
                .map(Bytes::from)
                .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))
        })
        .await?;
    Ok(json_bytes(body))
}

fn json_bytes(body: impl Into<Body>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body.into()).into_response()
}

#[derive(Deserialize)]
pub(super) struct JobsQuery {
    filter: Option<String>,
    page: Option<usize>,
    per_page: Option<usize>,
}

/// The most jobs one page of `/api/v1/jobs` lists.
const PER_PAGE_LIMIT: usize = 500;
const PER_PAGE_DEFAULT: usize = 100;
/// The longest filter, in bytes.
const FILTER_LIMIT: usize = 256;

/// `GET /api/v1/jobs?filter=&page=&per_page=`: one page of jobs sorted by name, as in
/// `status`, of those whose name, schedule or time zone contains `filter` (any case), with how
/// many matched, how many there are and how many are paused. Only the page's own records are
/// read from etcd.
pub(super) async fn jobs(State(app): State<Arc<App>>, headers: HeaderMap, Query(query): Query<JobsQuery>) -> Answer {
    app.authorize_read(&headers)?;
    let exposed = app.exposed()?;
    let page = query.page.unwrap_or(1);
    let per_page = query.per_page.unwrap_or(PER_PAGE_DEFAULT);
    if page == 0 {
        return Err(bad_request("page counts from 1"));
    }
    if !(1..=PER_PAGE_LIMIT).contains(&per_page) {
        return Err(bad_request(format!("per_page must be 1 to {PER_PAGE_LIMIT}")));
    }
    let filter = query.filter.unwrap_or_default().trim().to_lowercase();
    if filter.len() > FILTER_LIMIT {
        return Err(bad_request(format!("the filter is longer than {FILTER_LIMIT} bytes")));
    }
    let _permit = app.reads.permit().await?;
    let now = Utc::now();
    let pauses = crate::pauses::in_force(&exposed.client, &app.keys(), now)
        .await
        .map_err(etcd_failed)?;
    let all = jobs_by_name(exposed);
    let total = all.len();
    let pause_all = pauses.contains_key(crate::pauses::EVERY_JOB);
    let paused_names: std::collections::HashSet<String> = pauses.keys().cloned().collect();
    let (matched, paused, shown) = tokio::task::spawn_blocking(move || {
        let paused = if pause_all {
            all.len()
        } else {
            all.iter().filter(|job| paused_names.contains(&job.name)).count()
        };
        let matching: Vec<Arc<Job>> = all.into_iter().filter(|job| job_matches(job, &filter)).collect();
        let matched = matching.len();
        let shown: Vec<Arc<Job>> = matching
            .into_iter()
            .skip((page - 1).saturating_mul(per_page))
            .take(per_page)
            .collect();
        (matched, paused, shown)
    })
    .await
    .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
    let shown: Vec<&Job> = shown.iter().map(Arc::as_ref).collect();
    let statuses = crate::status::read_jobs(&app.cluster, &shown, &exposed.client, &pauses, now)
        .await
        .map_err(etcd_failed)?;
    Ok(Json(json!({
        "jobs": statuses,
        "page": page,
        "per_page": per_page,
        "matched": matched,
        "total": total,
        "paused": paused,
    }))
    .into_response())
}

/// The dashboard's filter: `filter` (lowercased) within the name, schedule or time zone.
fn job_matches(job: &Job, filter: &str) -> bool {
    if filter.is_empty() {
        return true;
    }
    let contains = |text: &str| text.to_lowercase().contains(filter);
    contains(&job.name) || contains(job.schedule.expanded()) || contains(job.schedule.zone().name())
}

#[derive(Deserialize)]
pub(super) struct HistoryQuery {
    count: Option<usize>,
}

/// `GET /api/v1/jobs/{name}/history?count=N`: the job's newest runs, newest first.
pub(super) async fn history(
    State(served): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    Query(query): Query<HistoryQuery>,
) -> Answer {
    served.authorize_read(&headers)?;
    no_wildcard(&name)?;
    if query.count == Some(0) {
        return Err(bad_request("count must be at least 1"));
    }
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
pub(super) async fn plan(State(app): State<Arc<App>>, headers: HeaderMap, Query(query): Query<PlanQuery>) -> Answer {
    app.authorize_read(&headers)?;
    let exposed = app.exposed()?;
    let from = match &query.from {
        Some(from) => DateTime::parse_from_rfc3339(from)
            .map_err(|err| bad_request(format!("from={from:?} is not an RFC 3339 instant: {err}")))?
            .with_timezone(&Utc),
        None => Utc::now(),
    };
    let length = match &query.length {
        Some(length) => crate::bounds::window(length).map_err(|err| bad_request(format!("for={length:?}: {err}")))?,
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
    let _permit = app.reads.permit().await?;
    let jobs = jobs_by_name(exposed);
    let body = tokio::task::spawn_blocking(move || {
        let jobs: Vec<&Job> = jobs
            .iter()
            .map(Arc::as_ref)
            .filter(|job| query.job.as_ref().is_none_or(|wanted| *wanted == job.name))
            .collect();
        let (fires, cut) = crate::plan::fires(&jobs, from, to, limit);
        plan_body(&fires, cut)
    })
    .await
    .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?
    .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
    Ok(json_bytes(body))
}

/// `{"fires": [...], "cut": bool}` written fire by fire into one buffer: a tree of JSON values
/// for 10,000 fires took 14 MB a request.
fn plan_body(fires: &[crate::plan::Fire], cut: bool) -> Result<Vec<u8>, serde_json::Error> {
    use std::io::Write;
    // About 170 bytes a fire.
    let mut body = Vec::with_capacity(32 + fires.len() * 170);
    body.extend_from_slice(b"{\"fires\":[");
    for (index, fire) in fires.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        serde_json::to_writer(&mut body, &crate::plan::PlannedFire::from(fire))?;
    }
    write!(body, "],\"cut\":{cut}}}").map_err(serde_json::Error::io)?;
    Ok(body)
}

/// A write's body: JSON or nothing.
fn parse_body<T: serde::de::DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, Failure> {
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
    State(served): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    no_wildcard(&name)?;
    let (exposed, asked): (_, TriggerBody) = served.write_to_job(&headers, &name, body).await?;
    let timeout = match &asked.timeout {
        Some(timeout) => {
            crate::bounds::wait(timeout).map_err(|err| bad_request(format!("timeout {timeout:?}: {err}")))?
        }
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
    State(served): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    no_wildcard(&name)?;
    let (exposed, asked): (_, PauseBody) = served.write_to_job(&headers, &name, body).await?;
    let length = asked
        .length
        .as_deref()
        .map(crate::bounds::window)
        .transpose()
        .map_err(|err| bad_request(format!("for: {err}")))?;
    let pause = crate::pauses::Pause::asked(Utc::now(), asked.until, length, asked.reason)
        .map_err(|refused| bad_request(refused.to_string()))?;
    crate::pauses::pause(&exposed.client, &served.keys(), std::slice::from_ref(&name), &pause)
        .await
        .map_err(etcd_failed)?;
    tracing::info!(job = %name, until = ?pause.until, reason = ?pause.reason, "paused through the API");
    Ok(Json(json!({ "job": name, "paused": pause })).into_response())
}

/// `POST /api/v1/jobs/{name}/resume`: ends the job's pause; `"resumed": false` if none held.
pub(super) async fn resume(State(served): State<Arc<App>>, Path(name): Path<String>, headers: HeaderMap) -> Answer {
    no_wildcard(&name)?;
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
