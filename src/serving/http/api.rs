//! The JSON API: the reads and writes of `status`, `history`, `plan`, `trigger`, `pause`,
//! `resume` and `backfill`, with the same semantics as those commands.
//!
//! Every error is `{"error": "..."}` with a status that says what to do next: 400 fix the
//! request, 401 send the right token, 403 writes are off on this node, 404 no such job, 413 the
//! body is too large, 421 the `Host` is not this listener's, 503 the node has no etcd
//! connection yet, etcd failed or too many reads run at once (retry), 504 no leader took a run
//! in time.
//!
//! This file holds the errors, the tokens' checks and what reads and writes share; `reads`,
//! `writes` and `backfill` the handlers.

use std::sync::Arc;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::Served;
use crate::rules::config::Job;
use crate::serving::http::Exposed;

mod backfill;
mod reads;
mod writes;

pub(super) use backfill::{ask as backfill, cancel as cancel_backfill, progress as backfill_progress};
pub(super) use reads::{activity, history, job, jobs, plan, run, status};
pub(super) use writes::{pause, resume, trigger};

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

/// `*` names every job in etcd's pause keys (`pause --all`); through the API it is no job,
/// for every verb.
fn no_wildcard(name: &str) -> Result<(), Failure> {
    if name == crate::coord::pauses::EVERY_JOB {
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

/// `GET /jobs/{name}`: the job's page, or a page answering 404 for a job the node's config does
/// not have. Only a request that may read learns which: to others the page is the same either
/// way, and what it reads answers 401.
pub(super) async fn job_page(
    axum::extract::State(app): axum::extract::State<Arc<super::App>>,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Response {
    let known = match (app.authorize_read(&headers), app.exposed()) {
        (Ok(()), Ok(exposed)) => app.jobs_by_name(exposed).await.get(&name).is_some(),
        _ => true,
    };
    match known {
        true => axum::response::Html(super::JOB_PAGE).into_response(),
        false => (StatusCode::NOT_FOUND, axum::response::Html(super::NO_JOB_PAGE)).into_response(),
    }
}

impl super::App {
    /// The node's jobs of its current config, by name.
    async fn jobs_by_name(&self, exposed: &Exposed) -> Arc<super::index::ByName> {
        let loaded = exposed.jobs.borrow().clone();
        self.jobs.of(loaded).await
    }

    /// The job `name` of the node's config, or 404.
    async fn job_named(&self, exposed: &Exposed, name: &str) -> Result<Arc<Job>, Failure> {
        self.jobs_by_name(exposed).await.get(name).cloned().ok_or_else(|| {
            Failure(
                StatusCode::NOT_FOUND,
                format!("no job {name:?} in this node's jobs.toml"),
            )
        })
    }
}
