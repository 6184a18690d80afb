//! The API's backfills: ask for one (or list its ticks with `dry_run`), cancel it, read its
//! progress; the same rules and refusals as `shardcron backfill`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::{bad_request, etcd_failed, no_wildcard, Answer, Failure};
use crate::coord::backfills::{self, Asked};
use crate::rules::backfill::{self, Ask, Backfill, DEFAULT_MAX};
use crate::rules::plan::PlannedFire;
use crate::rules::pools::FanOut;
use crate::serving::http::App;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(in crate::serving::http) struct BackfillBody {
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    max: Option<usize>,
    parallel: Option<u32>,
    #[serde(default)]
    dry_run: bool,
}

/// A backfill's record as the API answers it, with whether it is over.
fn shown(name: &str, backfill: &Backfill) -> serde_json::Value {
    json!({ "job": name, "over": backfill.is_over(), "backfill": backfill })
}

/// `POST /api/v1/jobs/{name}/backfill` with `{"from", "to"}` (RFC 3339) and optional `"max"`,
/// `"parallel"` and `"dry_run"`: 202 with the record once written; 200 with the ticks for a dry
/// run; 409 while another backfill of the job is going.
pub(in crate::serving::http) async fn ask(
    State(served): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    no_wildcard(&name)?;
    let (exposed, asked): (_, BackfillBody) = served.write_to_job(&headers, &name, body).await?;
    let job = served.job_named(exposed, &name).await?;
    if job.fan_out == FanOut::All {
        return Err(bad_request(format!(
            "{name} has fan_out = \"all\": backfill runs a job's ticks on one node, and does not run fanned-out jobs"
        )));
    }
    let (Some(from), Some(to)) = (asked.from, asked.to) else {
        return Err(bad_request("\"from\" and \"to\" (RFC 3339) are needed"));
    };
    let ask = Ask {
        from,
        to,
        max: asked.max.unwrap_or(DEFAULT_MAX),
        parallel: asked.parallel.unwrap_or(1),
    };
    if from < DateTime::<Utc>::UNIX_EPOCH {
        return Err(bad_request(format!(
            "\"from\" is {}, before 1970: no tick of a schedule is that old",
            crate::clock::rfc3339(from)
        )));
    }
    let now = Utc::now();
    // Up to 100,000 ticks listed (and for a dry run written out): not on a runtime thread
    // that fires ticks.
    let dry_run = asked.dry_run;
    let listed = tokio::task::spawn_blocking(move || -> Result<Listed, Failure> {
        let fires = backfill::ticks(&job, &ask, now).map_err(|refused| bad_request(refused.to_string()))?;
        if dry_run {
            let body = dry_run_body(&job.name, &fires)
                .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))?;
            return Ok(Listed::DryRun(body));
        }
        Ok(Listed::Record(Backfill::new(backfill::new_id(), &ask, &fires, now)))
    })
    .await
    .map_err(|err| Failure(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()))??;
    let record = match listed {
        Listed::DryRun(body) => {
            return Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response());
        }
        Listed::Record(record) => record,
    };
    let written = backfills::ask(&exposed.client, &served.keys(), &name, &record)
        .await
        .map_err(etcd_failed)?;
    if let Asked::Going(going) = written {
        let (done, total) = going.progress();
        return Err(Failure(
            StatusCode::CONFLICT,
            format!("{name} has a backfill going ({done}/{total} done): wait for it, or cancel it"),
        ));
    }
    tracing::info!(job = %name, backfill = %record.id, ticks = record.total, from = %crate::clock::rfc3339(from), to = %crate::clock::rfc3339(to), "backfill asked for through the API");
    Ok((StatusCode::ACCEPTED, Json(shown(&name, &record))).into_response())
}

/// What a backfill asked for lists: a dry run's answer, or the record to write.
enum Listed {
    DryRun(Vec<u8>),
    Record(Backfill),
}

/// `{"job": ..., "ticks": [...]}` written tick by tick into one buffer, as the plan's answer.
fn dry_run_body(job: &str, fires: &[crate::rules::plan::Fire]) -> Result<Vec<u8>, serde_json::Error> {
    let mut body = Vec::with_capacity(32 + fires.len() * 170);
    body.extend_from_slice(b"{\"job\":");
    serde_json::to_writer(&mut body, job)?;
    body.extend_from_slice(b",\"ticks\":[");
    for (index, fire) in fires.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        serde_json::to_writer(&mut body, &PlannedFire::from(fire))?;
    }
    body.extend_from_slice(b"]}");
    Ok(body)
}

/// `POST /api/v1/jobs/{name}/backfill/cancel`: no tick of the job's backfill is claimed after
/// it; 404 if the job has none.
pub(in crate::serving::http) async fn cancel(
    State(served): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    no_wildcard(&name)?;
    let (exposed, ()): (_, ()) = served.write_to_job(&headers, &name, body).await?;
    let cancelled = backfills::cancel(&exposed.client, &served.keys(), &name)
        .await
        .map_err(etcd_failed)?;
    let Some(cancelled) = cancelled else {
        return Err(Failure(StatusCode::NOT_FOUND, format!("{name} has no backfill")));
    };
    tracing::info!(job = %name, backfill = %cancelled.id, "backfill cancelled through the API");
    Ok(Json(shown(&name, &cancelled)).into_response())
}

/// `GET /api/v1/jobs/{name}/backfill`: the job's backfill and its progress; 404 if it has none.
pub(in crate::serving::http) async fn progress(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    app.authorize_read(&headers)?;
    no_wildcard(&name)?;
    let exposed = app.exposed()?;
    let read = backfills::read(&exposed.client, &app.keys(), &name)
        .await
        .map_err(etcd_failed)?;
    let Some((backfill, _)) = read else {
        return Err(Failure(StatusCode::NOT_FOUND, format!("{name} has no backfill")));
    };
    Ok(Json(shown(&name, &backfill)).into_response())
}
