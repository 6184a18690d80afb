//! The API's writes: `trigger`, `pause` and `resume`, each behind the write token, with a
//! small body that must arrive in time.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;

use super::{bad_request, etcd_failed, no_wildcard, Answer, Failure};
use crate::serving::http::App;
use crate::serving::http::Exposed;

impl App {
    /// What a write to job `name` needs first: the token, a connected node, the job, and the
    /// request's body, read only once the token passed.
    pub(super) async fn write_to_job<T: serde::de::DeserializeOwned + Default>(
        &self,
        headers: &HeaderMap,
        name: &str,
        body: Body,
    ) -> Result<(&Exposed, T), Failure> {
        self.authorize(headers)?;
        let exposed = self.exposed()?;
        self.job_named(exposed, name).await?;
        let bytes = read_body(body).await?;
        Ok((exposed, parse_body(&bytes)?))
    }
}

/// The largest body a write takes: its fields are a duration, a flag, an instant and a reason
/// of at most [`crate::coord::pauses::MAX_REASON`] bytes.
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

/// A write's body: JSON or nothing.
fn parse_body<T: serde::de::DeserializeOwned + Default>(bytes: &Bytes) -> Result<T, Failure> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|err| bad_request(format!("the body is not the JSON expected: {err}")))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(in crate::serving::http) struct TriggerBody {
    /// How long a leader has to take the run (default 10 s), as `shardcron trigger --timeout`.
    timeout: Option<String>,
    /// Answer when the run ended, with its record, as `trigger --wait`.
    #[serde(default)]
    wait: bool,
}

/// `POST /api/v1/jobs/{name}/trigger`: 202 once a leader took the run, or with `"wait": true`
/// 200 with the run's record once it ended.
pub(in crate::serving::http) async fn trigger(
    State(served): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    no_wildcard(&name)?;
    let (exposed, asked): (_, TriggerBody) = served.write_to_job(&headers, &name, body).await?;
    let timeout = match &asked.timeout {
        Some(timeout) => {
            crate::rules::bounds::wait(timeout).map_err(|err| bad_request(format!("timeout {timeout:?}: {err}")))?
        }
        None => Duration::from_secs(10),
    };
    let keys = served.keys();
    let fanned_out = exposed
        .jobs
        .borrow()
        .fanned_out
        .iter()
        .find(|job| job.name == name)
        .cloned();
    if let Some(job) = fanned_out {
        return trigger_each(exposed, &keys, &job, timeout, asked.wait).await;
    }
    let claimed = crate::coord::triggers::ask(&exposed.client, &keys, &name, timeout)
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
        crate::coord::triggers::forget(&exposed.client, &keys, &claimed.id)
            .await
            .map_err(etcd_failed)?;
        return Ok((StatusCode::ACCEPTED, Json(taken)).into_response());
    }
    let run = crate::coord::triggers::wait_for_run(&exposed.client, &keys, &claimed)
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

/// A trigger of a `fan_out = "all"` job: a run on every live node with its tags. 202 with each
/// node's claim (`runs`) and the nodes that took none in time (`not_taken`); with `"wait":
/// true`, 200 once every claimed run ended, each with its record.
async fn trigger_each(
    exposed: &crate::serving::http::Exposed,
    keys: &crate::coord::keys::Keys,
    job: &crate::rules::config::Job,
    timeout: Duration,
    wait: bool,
) -> Answer {
    let asked = crate::coord::triggers::ask_each(&exposed.client, keys, &job.name, &job.run_on, timeout)
        .await
        .map_err(etcd_failed)?;
    if asked.is_empty() {
        return Err(Failure(
            StatusCode::CONFLICT,
            format!(
                "{} fans out to every node with its run_on tags, and no live node has them all",
                job.name
            ),
        ));
    }
    let mut runs = Vec::new();
    let mut not_taken = Vec::new();
    for (node, claimed) in asked {
        let Some(claimed) = claimed else {
            not_taken.push(node);
            continue;
        };
        let run = if wait {
            crate::coord::triggers::wait_for_run(&exposed.client, keys, &claimed)
                .await
                .map_err(etcd_failed)?
        } else {
            crate::coord::triggers::forget(&exposed.client, keys, &claimed.id)
                .await
                .map_err(etcd_failed)?;
            None
        };
        runs.push(json!({ "node": claimed.node, "fence": claimed.fence, "id": claimed.id, "run": run }));
    }
    tracing::info!(job = %job.name, runs = runs.len(), not_taken = ?not_taken, "runs on every eligible node asked for through the API");
    let status = if wait { StatusCode::OK } else { StatusCode::ACCEPTED };
    let body = json!({ "job": job.name, "fan_out": "all", "runs": runs, "not_taken": not_taken });
    Ok((status, Json(body)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(in crate::serving::http) struct PauseBody {
    until: Option<DateTime<Utc>>,
    #[serde(rename = "for")]
    length: Option<String>,
    reason: Option<String>,
}

/// `POST /api/v1/jobs/{name}/pause` with `{"until": RFC 3339}` or `{"for": "1h"}` and an
/// optional `"reason"`; neither: until resumed.
pub(in crate::serving::http) async fn pause(
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
        .map(crate::rules::bounds::window)
        .transpose()
        .map_err(|err| bad_request(format!("for: {err}")))?;
    let pause = crate::coord::pauses::Pause::asked(Utc::now(), asked.until, length, asked.reason)
        .map_err(|refused| bad_request(refused.to_string()))?;
    crate::coord::pauses::pause(&exposed.client, &served.keys(), std::slice::from_ref(&name), &pause)
        .await
        .map_err(etcd_failed)?;
    tracing::info!(job = %name, until = %crate::clock::shown(pause.until), reason = pause.reason.as_deref().unwrap_or("-"), "paused through the API");
    Ok(Json(json!({ "job": name, "paused": pause })).into_response())
}

/// `POST /api/v1/jobs/{name}/resume`: ends the job's pause; `"resumed": false` if none held.
pub(in crate::serving::http) async fn resume(
    State(served): State<Arc<App>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Answer {
    no_wildcard(&name)?;
    served.authorize(&headers)?;
    let exposed = served.exposed()?;
    let ended = crate::coord::pauses::resume(
        &exposed.client,
        &served.keys(),
        Some(std::slice::from_ref(&name)),
        Utc::now(),
    )
    .await
    .map_err(etcd_failed)?;
    if ended.is_empty() {
        served.job_named(exposed, &name).await?;
    } else {
        tracing::info!(job = %name, "resumed through the API");
    }
    Ok(Json(json!({ "job": name, "resumed": !ended.is_empty() })).into_response())
}
