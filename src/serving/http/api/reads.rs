//! The API's reads: `status`, `jobs`, a job's `history` and the `plan`, each behind the read
//! token when one is set.

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

use super::{bad_request, etcd_failed, no_wildcard, Answer, Failure};
use crate::rules::config::Job;
use crate::serving::http::App;

#[derive(Deserialize)]
pub(in crate::serving::http) struct StatusQuery {
    /// `false` leaves the jobs out: nodes and shards only, which the dashboard reads while
    /// it pages through the jobs with `/api/v1/jobs`.
    jobs: Option<bool>,
}

/// `GET /api/v1/status[?jobs=false]`: the document of `status --json`, at most a second old.
pub(in crate::serving::http) async fn status(
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
            let jobs = if with_jobs {
                app.jobs_by_name(exposed).await.all().to_vec()
            } else {
                Vec::new()
            };
            let (digest, elections, groups) = {
                let loaded = exposed.jobs.borrow();
                (
                    loaded.digest.clone(),
                    Arc::clone(&loaded.elections),
                    loaded.groups.clone(),
                )
            };
            let status = crate::serving::status::read_document(
                &app.cluster,
                &elections,
                &digest,
                &groups,
                jobs,
                &exposed.client,
            )
            .await
            .map_err(etcd_failed)?;
            // Tens of megabytes at 100,000 jobs: not on a runtime thread that fires ticks.
            tokio::task::spawn_blocking(move || match with_jobs {
                true => serde_json::to_vec(&status),
                // Left out, not an empty list: a reader cannot take it for a fleet without jobs.
                false => serde_json::to_value(&status).and_then(|mut document| {
                    if let Some(fields) = document.as_object_mut() {
                        fields.remove("jobs");
                    }
                    serde_json::to_vec(&document)
                }),
            })
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
pub(in crate::serving::http) struct JobsQuery {
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
pub(in crate::serving::http) async fn jobs(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(query): Query<JobsQuery>,
) -> Answer {
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
    let pauses = crate::coord::pauses::in_force(&exposed.client, &app.keys(), now)
        .await
        .map_err(etcd_failed)?;
    let all = app.jobs_by_name(exposed).await;
    let total = all.all().len();
    let pause_all = pauses.contains_key(crate::coord::pauses::EVERY_JOB);
    let paused_names: std::collections::HashSet<String> = pauses.keys().cloned().collect();
    let (matched, paused, shown) = tokio::task::spawn_blocking(move || {
        let all = all.all();
        let paused = if pause_all {
            all.len()
        } else {
            all.iter().filter(|job| paused_names.contains(&job.name)).count()
        };
        let matching: Vec<Arc<Job>> = all.iter().filter(|job| job_matches(job, &filter)).cloned().collect();
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
    let elections = Arc::clone(&exposed.jobs.borrow().elections);
    let statuses = crate::serving::status::read_jobs(&app.cluster, &elections, &shown, &exposed.client, pauses, now)
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

/// `GET /api/v1/jobs/{name}`: one job, as an entry of `/api/v1/jobs` (the job page's).
pub(in crate::serving::http) async fn job(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    app.authorize_read(&headers)?;
    no_wildcard(&name)?;
    let exposed = app.exposed()?;
    let job = app.job_named(exposed, &name).await?;
    let _permit = app.reads.permit().await?;
    let now = Utc::now();
    let pauses = crate::coord::pauses::in_force(&exposed.client, &app.keys(), now)
        .await
        .map_err(etcd_failed)?;
    let elections = Arc::clone(&exposed.jobs.borrow().elections);
    let statuses =
        crate::serving::status::read_jobs(&app.cluster, &elections, &[job.as_ref()], &exposed.client, pauses, now)
            .await
            .map_err(etcd_failed)?;
    Ok(Json(statuses.into_iter().next()).into_response())
}

/// `GET /api/v1/activity`: the fleet's runs per minute over the last hour, oldest minute first,
/// by how they ended (each live node's own count, summed).
pub(in crate::serving::http) async fn activity(State(app): State<Arc<App>>, headers: HeaderMap) -> Answer {
    app.authorize_read(&headers)?;
    let exposed = app.exposed()?;
    let _permit = app.reads.permit().await?;
    let hour = crate::coord::activity::read_fleet(&exposed.client, &app.keys(), Utc::now())
        .await
        .map_err(etcd_failed)?;
    let minutes: Vec<serde_json::Value> = hour
        .into_iter()
        .map(|(start, counts)| {
            let at = DateTime::from_timestamp(start, 0).unwrap_or_default();
            json!({
                "at": at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "success": counts.success,
                "failure": counts.failure,
                "held": counts.held,
                "lost": counts.lost,
            })
        })
        .collect();
    Ok(Json(json!({ "minutes": minutes })).into_response())
}

#[derive(Deserialize)]
pub(in crate::serving::http) struct HistoryQuery {
    count: Option<usize>,
    /// With each run's kept output; without, a page of runs stays small (each run may keep
    /// up to 128 KiB), and `/runs/{tick}` gives one run's output.
    output: Option<bool>,
}

/// The most runs a history answer with output lists: each may keep 128 KiB.
const HISTORY_WITH_OUTPUT: usize = 50;

/// `GET /api/v1/jobs/{name}/history?count=N[&output=true]`: the job's newest runs, newest
/// first, behind a read permit; at most [`HISTORY_WITH_OUTPUT`] with their output.
pub(in crate::serving::http) async fn history(
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
    let with_output = query.output == Some(true);
    // Without output an entry is a few hundred bytes; with it up to 768 KiB in etcd.
    let most = if with_output {
        HISTORY_WITH_OUTPUT
    } else {
        crate::coord::history::READ_LIMIT
    };
    let count = query.count.unwrap_or(20).min(served.cluster.history as usize).min(most);
    let fans_out = exposed.jobs.borrow().fanned_out.iter().any(|job| job.name == name);
    let _permit = served.reads.permit().await?;
    let records = if fans_out {
        crate::coord::history::read_each(&exposed.client, &served.keys(), &name, count, with_output).await
    } else {
        crate::coord::history::read(&exposed.client, &served.keys(), &name, count, with_output).await
    }
    .map_err(etcd_failed)?;
    if records.is_empty() {
        served.job_named(exposed, &name).await?;
    }
    Ok(Json(records).into_response())
}

#[derive(Deserialize)]
pub(in crate::serving::http) struct RunQuery {
    /// Whose run, for a `fan_out = "all"` job: each node keeps a history of its own.
    node: Option<String>,
}

/// `GET /api/v1/jobs/{name}/runs/{tick}[?node=N]`: one run of the job from its history, by its
/// tick (RFC 3339; a run asked for by hand: when it was asked for, to the millisecond), with
/// its kept output.
pub(in crate::serving::http) async fn run(
    State(served): State<Arc<App>>,
    Path((name, tick)): Path<(String, String)>,
    headers: HeaderMap,
    Query(query): Query<RunQuery>,
) -> Answer {
    served.authorize_read(&headers)?;
    no_wildcard(&name)?;
    let tick = DateTime::parse_from_rfc3339(&tick)
        .map_err(|err| bad_request(format!("{tick:?} is not an RFC 3339 instant: {err}")))?
        .with_timezone(&Utc);
    let exposed = served.exposed()?;
    if served.cluster.history == 0 {
        return Err(Failure(
            StatusCode::NOT_FOUND,
            "this cluster keeps no history ([cluster] history = 0)".to_string(),
        ));
    }
    served.job_named(exposed, &name).await?;
    let fans_out = exposed.jobs.borrow().fanned_out.iter().any(|job| job.name == name);
    let kept_as = match (fans_out, &query.node) {
        (false, _) => name.clone(),
        (true, Some(node)) if crate::rules::config::valid_name(node) => format!("{name}@{node}"),
        (true, Some(node)) => return Err(bad_request(format!("{node:?} is not a node id"))),
        (true, None) => {
            return Err(bad_request(format!(
                "{name} runs on every eligible node (fan_out = \"all\"): say whose run with ?node=ID"
            )))
        }
    };
    let _permit = served.reads.permit().await?;
    let record = crate::coord::history::read_run(&exposed.client, &served.keys(), &kept_as, tick)
        .await
        .map_err(etcd_failed)?;
    match record {
        Some(record) => Ok(Json(record).into_response()),
        None => Err(Failure(
            StatusCode::NOT_FOUND,
            format!("no run of {kept_as} at {} in its history", tick.to_rfc3339()),
        )),
    }
}

#[derive(Deserialize)]
pub(in crate::serving::http) struct PlanQuery {
    #[serde(rename = "for")]
    length: Option<String>,
    from: Option<String>,
    job: Option<String>,
    limit: Option<usize>,
}

/// The most fires one plan answer lists.
const PLAN_LIMIT: usize = 10_000;

/// `GET /api/v1/plan?for=24h[&from=RFC3339][&job=NAME][&limit=N]`: the lines of `plan --json`.
pub(in crate::serving::http) async fn plan(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(query): Query<PlanQuery>,
) -> Answer {
    app.authorize_read(&headers)?;
    let exposed = app.exposed()?;
    let from = match &query.from {
        Some(from) => DateTime::parse_from_rfc3339(from)
            .map_err(|err| bad_request(format!("from={from:?} is not an RFC 3339 instant: {err}")))?
            .with_timezone(&Utc),
        None => Utc::now(),
    };
    let length = match &query.length {
        Some(length) => {
            crate::rules::bounds::window(length).map_err(|err| bad_request(format!("for={length:?}: {err}")))?
        }
        None => Duration::from_secs(24 * 3600),
    };
    let to = chrono::Duration::from_std(length)
        .ok()
        .and_then(|length| from.checked_add_signed(length))
        .ok_or_else(|| bad_request("the window is too long"))?;
    if let Some(job) = &query.job {
        app.job_named(exposed, job).await?;
    }
    let limit = query.limit.unwrap_or(PLAN_LIMIT).min(PLAN_LIMIT);
    let _permit = app.reads.permit().await?;
    let jobs = app.jobs_by_name(exposed).await;
    let body = tokio::task::spawn_blocking(move || {
        let jobs: Vec<&Job> = jobs
            .all()
            .iter()
            .map(Arc::as_ref)
            .filter(|job| query.job.as_ref().is_none_or(|wanted| *wanted == job.name))
            .collect();
        let (fires, cut) = crate::rules::plan::fires(&jobs, from, to, limit);
        plan_body(&fires, cut)
    })
    .await
    .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?
    .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
    Ok(json_bytes(body))
}

/// `{"fires": [...], "cut": bool}` written fire by fire into one buffer: a tree of JSON values
/// for 10,000 fires took 14 MB a request.
fn plan_body(fires: &[crate::rules::plan::Fire], cut: bool) -> Result<Vec<u8>, serde_json::Error> {
    use std::io::Write;
    // About 170 bytes a fire.
    let mut body = Vec::with_capacity(32 + fires.len() * 170);
    body.extend_from_slice(b"{\"fires\":[");
    for (index, fire) in fires.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        serde_json::to_writer(&mut body, &crate::rules::plan::PlannedFire::from(fire))?;
    }
    write!(body, "],\"cut\":{cut}}}").map_err(serde_json::Error::io)?;
    Ok(body)
}
