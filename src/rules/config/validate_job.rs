//! A job's table turned into a validated [`Job`]: its name, schedule, command and timing, each
//! error naming the job and the field.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use toml::Spanned;

use super::error::{ConfigError, Source};
use super::model::*;
use super::raw::*;
use super::validate::{parse_duration, secret_path, valid_name};
use super::validate_named::{resolve, Shared};
use crate::rules::bounds;
use crate::rules::groups::Group;
use crate::rules::notify::check_url;
use crate::rules::output::{parse_size, DEFAULT_OUTPUT_TAIL, MAX_OUTPUT_TAIL};
use crate::rules::pools::Tags;
use crate::rules::schedule::{parse_zone, Schedule, ScheduleError};
use crate::rules::shard::shard_of;
use crate::rules::spread;

pub(super) fn validate_job(
    source: &Source,
    cluster: &Cluster,
    name: Spanned<String>,
    raw: Spanned<RawJob>,
    shared: &Shared,
    schedules: &mut HashMap<(String, Tz), Arc<Schedule>>,
) -> Result<Job, ConfigError> {
    let name_span = name.span();
    let name = name.into_inner();
    let job = Some(name.as_str());
    check_job_name(source, &name, name_span)?;
    let table_span = raw.span();
    let raw = raw.into_inner();

    let timezone = job_zone(source, job, raw.timezone.as_ref(), cluster)?;
    let schedule = job_schedule(source, job, raw.schedule.as_ref(), &table_span, timezone, schedules)?;
    let command = job_command(source, job, &raw, &table_span)?;
    let timing = job_timing(source, job, &raw)?;
    validate_env(source, job, &raw)?;
    let run_on = match &raw.run_on {
        Some(value) => Tags::new(value.get_ref())
            .map_err(|message| source.error(Some(value.span()), job, Some("run_on"), message))?,
        None => Tags::default(),
    };
    let group = match &raw.group {
        Some(value) => Some(job_group(source, job, value, &shared.groups)?),
        None => None,
    };
    let blackouts = resolve(
        source,
        job,
        "blackouts",
        raw.blackouts.as_ref(),
        &shared.blackouts,
        &shared.every_job_blackouts,
    )?;
    let notify = resolve(
        source,
        job,
        "notify",
        raw.notify.as_ref(),
        &shared.notifiers,
        &shared.every_job_notify,
    )?;
    let ping = job_ping(source, job, &raw)?;
    let output_tail = job_output_tail(source, job, raw.output_tail.as_ref())?;
    Ok(Job {
        // The number of its election is known once every job's pool is: see `config::parse`.
        shard: shard_of(&name, cluster.shards),
        pool_shard: shard_of(&name, cluster.shards),
        run_on,
        fan_out: raw.fan_out.map(Spanned::into_inner).unwrap_or_default(),
        instance_of: None,
        name,
        schedule,
        command,
        timeout: timing.timeout,
        kill_grace: timing.kill_grace,
        retries: timing.retries,
        retry_backoff: timing.retry_backoff,
        catch_up: raw.catch_up.map(Spanned::into_inner).unwrap_or_default(),
        starting_deadline: timing.starting_deadline,
        overlap: raw.overlap.map(Spanned::into_inner).unwrap_or_default(),
        delivery: raw.delivery.map(Spanned::into_inner).unwrap_or_default(),
        working_dir: raw.working_dir.map(Spanned::into_inner),
        env: raw.env.map(Spanned::into_inner).unwrap_or_default(),
        env_file: raw.env_file.map(Spanned::into_inner),
        group,
        output_tail,
        log_output: raw.log_output.map(Spanned::into_inner).unwrap_or_default(),
        blackouts,
        notify,
        ping: ping.map(Box::new),
    })
}

/// A job's name: what its keys, its API paths and its log lines are known by.
fn check_job_name(source: &Source, name: &str, span: std::ops::Range<usize>) -> Result<(), ConfigError> {
    if !valid_name(name) || name.len() > MAX_JOB_NAME {
        return Err(source.error(
            Some(span),
            Some(name),
            None,
            format!(
                "invalid job name: use at most {MAX_JOB_NAME} letters, digits, '.', '_' and '-' (not \".\" or \"..\")"
            ),
        ));
    }
    Ok(())
}

/// A job's `timezone`, the cluster's when not given.
fn job_zone(
    source: &Source,
    job: Option<&str>,
    raw: Option<&Spanned<String>>,
    cluster: &Cluster,
) -> Result<Tz, ConfigError> {
    Ok(match raw {
        Some(value) => parse_zone(value.get_ref())
            .map_err(|message| source.error(Some(value.span()), job, Some("timezone"), message))?,
        None => cluster.timezone,
    })
}

/// `ping_url` and `ping_method`.
fn job_ping(source: &Source, job: Option<&str>, raw: &RawJob) -> Result<Option<Ping>, ConfigError> {
    let Some(url) = &raw.ping_url else {
        if let Some(method) = &raw.ping_method {
            return Err(source.error(
                Some(method.span()),
                job,
                Some("ping_method"),
                "ping_method without ping_url: give the URL to ping after each success",
            ));
        }
        return Ok(None);
    };
    check_url(url.get_ref()).map_err(|why| source.error(Some(url.span()), job, Some("ping_url"), why))?;
    Ok(Some(Ping {
        url: url.get_ref().clone(),
        method: raw
            .ping_method
            .as_ref()
            .map(|method| *method.get_ref())
            .unwrap_or_default(),
    }))
}

/// `output_tail`: 0 up to [`MAX_OUTPUT_TAIL`] bytes per stream.
fn job_output_tail(source: &Source, job: Option<&str>, raw: Option<&Spanned<RawSize>>) -> Result<usize, ConfigError> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_OUTPUT_TAIL);
    };
    let error = |message: String| source.error(Some(raw.span()), job, Some("output_tail"), message);
    let bytes = match raw.get_ref() {
        RawSize::Bytes(bytes) => usize::try_from(*bytes).map_err(|_| error(format!("{bytes} is not a size")))?,
        RawSize::Text(text) => parse_size(text).map_err(error)?,
    };
    if bytes > MAX_OUTPUT_TAIL {
        return Err(error(format!(
            "{bytes} bytes is more than a run may keep: at most \"64KiB\" ({MAX_OUTPUT_TAIL} bytes) per stream"
        )));
    }
    Ok(bytes)
}

/// The `[groups.<name>]` a job's `group` names.
fn job_group(
    source: &Source,
    job: Option<&str>,
    name: &Spanned<String>,
    groups: &GroupsByName,
) -> Result<Arc<Group>, ConfigError> {
    groups.get(name.get_ref()).cloned().ok_or_else(|| {
        let known: Vec<&str> = groups.keys().map(String::as_str).take(10).collect();
        let known = match known.is_empty() {
            true => "the file defines no [groups.<name>]".to_string(),
            false => format!("groups defined: {}", known.join(", ")),
        };
        source.error(
            Some(name.span()),
            job,
            Some("group"),
            format!(
                "unknown group {:?}: {known}{}",
                name.get_ref(),
                crate::rules::suggest::did_you_mean(name.get_ref(), groups.keys().map(String::as_str))
            ),
        )
    })
}

/// The job's schedule, parsed once per distinct list of expressions and zone: jobs share it.
fn job_schedule(
    source: &Source,
    job: Option<&str>,
    expression: Option<&Spanned<RawSchedule>>,
    table_span: &std::ops::Range<usize>,
    timezone: Tz,
    schedules: &mut HashMap<(String, Tz), Arc<Schedule>>,
) -> Result<Arc<Schedule>, ConfigError> {
    let expression = expression.ok_or_else(|| {
        source.error(
            Some(table_span.clone()),
            job,
            Some("schedule"),
            "missing schedule: add schedule = \"...\", a cron expression such as \"*/5 * * * *\"",
        )
    })?;
    let expressions: Vec<&str> = expression.get_ref().0.iter().map(String::as_str).collect();
    let schedule_error =
        |err: ScheduleError| source.error(Some(expression.span()), job, Some("schedule"), err.to_string());
    // Jobs share one parsed schedule per distinct list and zone; an `H` makes the list the job's own.
    let shared = !expressions.iter().any(|expression| spread::uses_hash(expression));
    let key = (
        expressions
            .iter()
            .map(|expression| expression.trim())
            .collect::<Vec<_>>()
            .join("\n"),
        timezone,
    );
    Ok(match schedules.get(&key).filter(|_| shared) {
        Some(schedule) => Arc::clone(schedule),
        None => {
            let parsed = Arc::new(Schedule::parse_for_job(&expressions, timezone, job).map_err(schedule_error)?);
            if shared {
                schedules.insert(key, Arc::clone(&parsed));
            }
            parsed
        }
    })
}

/// The job's command, present and not empty; no NUL in it, its working directory or its
/// environment.
fn job_command(
    source: &Source,
    job: Option<&str>,
    raw: &RawJob,
    table_span: &std::ops::Range<usize>,
) -> Result<String, ConfigError> {
    let command = raw.command.as_ref().ok_or_else(|| {
        source.error(
            Some(table_span.clone()),
            job,
            Some("command"),
            "missing command: add command = \"...\", a shell command line",
        )
    })?;
    if command.get_ref().trim().is_empty() {
        return Err(source.error(
            Some(command.span()),
            job,
            Some("command"),
            "command is empty: give it a shell command line",
        ));
    }
    // A NUL cannot pass through exec: every run of the job would fail to start.
    let nul = |span: std::ops::Range<usize>, field: &str| {
        source.error(
            Some(span),
            job,
            Some(field),
            "contains a NUL byte, which no command, variable or path can hold",
        )
    };
    if command.get_ref().contains('\0') {
        return Err(nul(command.span(), "command"));
    }
    if let Some(dir) = raw
        .working_dir
        .as_ref()
        .filter(|dir| dir.get_ref().as_os_str().as_encoded_bytes().contains(&0))
    {
        return Err(nul(dir.span(), "working_dir"));
    }
    if let Some(env) = raw.env.as_ref().filter(|env| {
        env.get_ref()
            .iter()
            .any(|(key, value)| key.contains('\0') || value.contains('\0'))
    }) {
        return Err(nul(env.span(), "env"));
    }
    Ok(command.get_ref().clone())
}

/// How long a run may take, how it ends, and how it is retried.
struct Timing {
    timeout: Option<Duration>,
    kill_grace: Duration,
    retries: u32,
    retry_backoff: Duration,
    starting_deadline: Option<Duration>,
}

fn job_timing(source: &Source, job: Option<&str>, raw: &RawJob) -> Result<Timing, ConfigError> {
    let timeout = raw
        .timeout
        .as_ref()
        .map(|value| parse_duration(source, value, job, "timeout", bounds::MAX_WINDOW))
        .transpose()?;
    if let (Some(Duration::ZERO), Some(value)) = (timeout, &raw.timeout) {
        return Err(source.error(
            Some(value.span()),
            job,
            Some("timeout"),
            "timeout must be longer than zero",
        ));
    }
    let kill_grace = raw
        .kill_grace
        .as_ref()
        .map(|value| parse_duration(source, value, job, "kill_grace", bounds::MAX_WAIT))
        .transpose()?
        .unwrap_or(DEFAULT_KILL_GRACE);
    let retries = match &raw.retries {
        Some(value) if !(0..=MAX_RETRIES).contains(value.get_ref()) => {
            return Err(source.error(
                Some(value.span()),
                job,
                Some("retries"),
                format!("retries must be between 0 and {MAX_RETRIES}"),
            ))
        }
        Some(value) => *value.get_ref() as u32,
        None => 0,
    };
    let retry_backoff = raw
        .retry_backoff
        .as_ref()
        .map(|value| parse_duration(source, value, job, "retry_backoff", bounds::MAX_WAIT))
        .transpose()?
        .unwrap_or(DEFAULT_RETRY_BACKOFF);
    if let (Some(value), None) = (&raw.retry_backoff, &raw.retries) {
        return Err(source.error(
            Some(value.span()),
            job,
            Some("retry_backoff"),
            "retry_backoff without retries has no effect; set retries",
        ));
    }
    let starting_deadline = raw
        .starting_deadline
        .as_ref()
        .map(|value| parse_duration(source, value, job, "starting_deadline", bounds::MAX_WINDOW))
        .transpose()?;
    Ok(Timing {
        timeout,
        kill_grace,
        retries,
        retry_backoff,
        starting_deadline,
    })
}

/// Variable names a job may set (not `CRON_*`, which shardcron sets), and an `env_file` path.
fn validate_env(source: &Source, job: Option<&str>, raw: &RawJob) -> Result<(), ConfigError> {
    if let Some(env) = &raw.env {
        if let Some(bad) = env
            .get_ref()
            .keys()
            .find(|key| key.is_empty() || key.contains('=') || key.starts_with("CRON_"))
        {
            return Err(source.error(
                Some(env.span()),
                job,
                Some("env"),
                format!("invalid variable name {bad:?} (CRON_* names are set by shardcron)"),
            ));
        }
    }
    if let Some(env_file) = &raw.env_file {
        secret_path(source, env_file, job, "env_file")?;
    }
    Ok(())
}
