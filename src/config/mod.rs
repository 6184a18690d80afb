//! `jobs.toml`, read once and turned into a validated [`Config`].
//!
//! The raw file is deserialized with spans kept on every value, then checked field by field; the
//! rest of the program only ever sees [`Config`] and [`Job`], whose schedules are parsed and whose
//! zones are resolved. Every error names the file, line, column, job and field.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use serde::Deserialize;
use toml::Spanned;

use crate::schedule::{parse_zone, Schedule};
use crate::shard::shard_of;

/// The most shards a cluster may have; each is an etcd election, so this bounds etcd load.
pub const MAX_SHARDS: u32 = 4096;
/// Job names become etcd key segments and log fields, so they are kept short and plain.
pub const MAX_JOB_NAME: usize = 128;

/// A validated `jobs.toml`.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub cluster: Cluster,
    pub etcd: Etcd,
    /// Sorted by name.
    pub jobs: Vec<Job>,
    /// seahash of the file's bytes, hex: nodes compare it to spot config drift.
    pub digest: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub name: String,
    pub shards: u32,
    pub lease_ttl: Duration,
    pub timezone: Tz,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Etcd {
    pub endpoints: Vec<String>,
    pub username: Option<String>,
    /// The name of the environment variable holding the password, never the password itself.
    pub password_env: Option<String>,
    pub tls: Option<EtcdTls>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EtcdTls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// One job, ready to schedule.
#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    pub shard: u32,
    /// Shared between jobs with the same (expression, zone): parsed once.
    pub schedule: Arc<Schedule>,
    pub command: String,
    pub timeout: Option<Duration>,
    /// After the timeout's (or a replacement's) SIGTERM, how long before SIGKILL.
    pub kill_grace: Duration,
    /// Further attempts after a failed run of the same tick, while this node leads the shard.
    pub retries: u32,
    /// The first retry's delay; each next one doubles, capped at [`MAX_RETRY_BACKOFF`], jittered.
    pub retry_backoff: Duration,
    pub catch_up: CatchUp,
    pub starting_deadline: Option<Duration>,
    pub overlap: Overlap,
    pub working_dir: Option<PathBuf>,
    pub env: BTreeMap<String, String>,
}

/// What a new leader does with ticks that passed while the shard had no leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// Run only the newest missed tick.
    #[default]
    Latest,
    /// Run every missed tick, oldest first.
    All,
    /// Run none of them.
    None,
}

/// What a tick does while the job's previous run on this node is still going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// Skip the new tick.
    #[default]
    Skip,
    /// Run both.
    Allow,
    /// Stop the running one (SIGTERM, SIGKILL after `kill_grace`), then run the new tick.
    Replace,
}

/// Default for `kill_grace`.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);
/// Default for `retry_backoff`.
pub const DEFAULT_RETRY_BACKOFF: Duration = Duration::from_secs(1);
/// Retry delays grow up to this.
pub const MAX_RETRY_BACKOFF: Duration = Duration::from_secs(300);
/// At most this many retries per tick: a job that needs more is failing, not flaky.
pub const MAX_RETRIES: i64 = 100;

#[cfg(test)]
impl Job {
    /// A job named `name` on `expression` in UTC with every other field at its default, for
    /// unit tests to adjust.
    pub(crate) fn for_tests(name: &str, expression: &str) -> Job {
        Job {
            name: name.into(),
            shard: 0,
            schedule: Arc::new(Schedule::parse(expression, chrono_tz::UTC).expect("a valid test schedule")),
            command: "true".into(),
            timeout: None,
            kill_grace: DEFAULT_KILL_GRACE,
            retries: 0,
            retry_backoff: DEFAULT_RETRY_BACKOFF,
            catch_up: CatchUp::default(),
            starting_deadline: None,
            overlap: Overlap::default(),
            working_dir: None,
            env: BTreeMap::new(),
        }
    }
}

/// A config that cannot be used, located as precisely as the file allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based line and column, when the problem has a place in the file.
    pub location: Option<(usize, usize)>,
    pub job: Option<String>,
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, column)) = self.location {
            write!(f, ":{line}:{column}")?;
        }
        write!(f, ":")?;
        if let Some(job) = &self.job {
            write!(f, " job {job:?}")?;
        }
        if let Some(field) = &self.field {
            if self.job.is_some() {
                write!(f, ",")?;
            }
            write!(f, " field {field:?}")?;
        }
        if self.job.is_some() || self.field.is_some() {
            write!(f, ":")?;
        }
        write!(f, " {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    cluster: Option<Spanned<RawCluster>>,
    etcd: Option<Spanned<RawEtcd>>,
    #[serde(default)]
    jobs: BTreeMap<Spanned<String>, Spanned<RawJob>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    name: Option<Spanned<String>>,
    shards: Option<Spanned<i64>>,
    lease_ttl: Option<Spanned<String>>,
    timezone: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEtcd {
    endpoints: Option<Spanned<Vec<String>>>,
    username: Option<Spanned<String>>,
    password_env: Option<Spanned<String>>,
    tls: Option<RawTls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    schedule: Option<Spanned<String>>,
    command: Option<Spanned<String>>,
    timezone: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    kill_grace: Option<Spanned<String>>,
    retries: Option<Spanned<i64>>,
    retry_backoff: Option<Spanned<String>>,
    catch_up: Option<Spanned<CatchUp>>,
    starting_deadline: Option<Spanned<String>>,
    overlap: Option<Spanned<Overlap>>,
    working_dir: Option<Spanned<PathBuf>>,
    env: Option<Spanned<BTreeMap<String, String>>>,
}

/// Reads and validates the config file at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|err| ConfigError {
        file: path.to_path_buf(),
        location: None,
        job: None,
        field: None,
        message: format!("cannot read config file: {err}"),
    })?;
    parse(path, &text)
}

/// Validates `text` as the contents of the config file `path`.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    let source = Source { path, text };
    let raw: RawFile = toml::from_str(text).map_err(|err| source.toml_error(&err))?;
    let cluster = validate_cluster(&source, raw.cluster)?;
    let etcd = validate_etcd(&source, raw.etcd)?;

    let mut schedules: HashMap<(String, Tz), Arc<Schedule>> = HashMap::new();
    let mut jobs = Vec::with_capacity(raw.jobs.len());
    for (name, job) in raw.jobs {
        jobs.push(validate_job(&source, &cluster, name, job, &mut schedules)?);
    }
    Ok(Config {
        path: path.to_path_buf(),
        cluster,
        etcd,
        jobs,
        digest: format!("{:016x}", seahash::hash(text.as_bytes())),
    })
}

/// The file being validated, for turning byte spans into line and column.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn error(
        &self,
        span: Option<Range<usize>>,
        job: Option<&str>,
        field: Option<&str>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.path.to_path_buf(),
            location: span.map(|span| self.line_column(span.start)),
            job: job.map(str::to_string),
            field: field.map(str::to_string),
            message: message.into(),
        }
    }

    fn line_column(&self, offset: usize) -> (usize, usize) {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |newline| newline + 1) + 1;
        (line, column)
    }

    /// A TOML or shape error. The parser knows only a span, so the job and field are read back
    /// from the file: the nearest `[jobs.NAME]` header above, and the key on the error's line.
    fn toml_error(&self, err: &toml::de::Error) -> ConfigError {
        let span = err.span();
        let offset = span.as_ref().map_or(0, |span| span.start);
        let (line, _) = self.line_column(offset);
        let lines: Vec<&str> = self.text.lines().collect();
        let job = lines[..line.min(lines.len())]
            .iter()
            .rev()
            .find_map(|line| job_header(line));
        let message = err.message().to_string();
        let field = backticked(&message)
            .filter(|_| message.starts_with("unknown field") || message.starts_with("missing field"))
            .or_else(|| lines.get(line - 1).and_then(|line| key_of(line)));
        let job = job.filter(|job| Some(job.as_str()) != field.as_deref());
        ConfigError {
            file: self.path.to_path_buf(),
            location: span.map(|span| self.line_column(span.start)),
            job,
            field,
            message: message.trim().to_string(),
        }
    }
}

/// `NAME` of a `[jobs.NAME]` table header line.
fn job_header(line: &str) -> Option<String> {
    let inner = line.trim().strip_prefix('[')?.split(']').next()?.trim();
    let name = inner.strip_prefix("jobs.")?.trim();
    Some(name.trim_matches('"').to_string())
}

/// The key of a `key = value` line.
fn key_of(line: &str) -> Option<String> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.starts_with('[') && !key.starts_with('#')).then(|| key.trim_matches('"').to_string())
}

fn backticked(message: &str) -> Option<String> {
    let start = message.find('`')? + 1;
    let len = message[start..].find('`')?;
    Some(message[start..start + len].to_string())
}

fn parse_duration(
    source: &Source,
    value: &Spanned<String>,
    job: Option<&str>,
    field: &str,
) -> Result<Duration, ConfigError> {
    humantime::parse_duration(value.get_ref().trim()).map_err(|err| {
        source.error(
            Some(value.span()),
            job,
            Some(field),
            format!(
                "invalid duration {:?}: {err} (examples: \"10s\", \"5m\", \"1h 30m\")",
                value.get_ref()
            ),
        )
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn validate_cluster(source: &Source, raw: Option<Spanned<RawCluster>>) -> Result<Cluster, ConfigError> {
    let Some(raw) = raw else {
        return Err(source.error(None, None, Some("cluster"), "missing [cluster] section"));
    };
    let table_span = raw.span();
    let raw = raw.into_inner();
    let field = |name: &str, message: String| source.error(Some(table_span.clone()), None, Some(name), message);

    let name = raw
        .name
        .ok_or_else(|| field("cluster.name", "missing cluster name".into()))?;
    if !valid_name(name.get_ref()) || name.get_ref() == "." || name.get_ref() == ".." {
        return Err(source.error(
            Some(name.span()),
            None,
            Some("cluster.name"),
            format!(
                "invalid cluster name {:?}: use letters, digits, '.', '_' and '-'",
                name.get_ref()
            ),
        ));
    }
    let shards = raw
        .shards
        .ok_or_else(|| field("cluster.shards", "missing shard count".into()))?;
    if !(1..=i64::from(MAX_SHARDS)).contains(shards.get_ref()) {
        return Err(source.error(
            Some(shards.span()),
            None,
            Some("cluster.shards"),
            format!("shards must be between 1 and {MAX_SHARDS}, found {}", shards.get_ref()),
        ));
    }
    let lease_ttl = match &raw.lease_ttl {
        Some(value) => parse_duration(source, value, None, "cluster.lease_ttl")?,
        None => Duration::from_secs(10),
    };
    if lease_ttl < Duration::from_secs(1) || lease_ttl.subsec_nanos() != 0 {
        let span = raw.lease_ttl.as_ref().map(|value| value.span());
        return Err(source.error(
            span,
            None,
            Some("cluster.lease_ttl"),
            format!("lease_ttl must be whole seconds and at least 1s (etcd leases count seconds), found {lease_ttl:?}"),
        ));
    }
    let timezone = match &raw.timezone {
        Some(value) => parse_zone(value.get_ref())
            .map_err(|message| source.error(Some(value.span()), None, Some("cluster.timezone"), message))?,
        None => Tz::UTC,
    };
    Ok(Cluster {
        name: name.into_inner(),
        shards: *shards.get_ref() as u32,
        lease_ttl,
        timezone,
    })
}

fn validate_etcd(source: &Source, raw: Option<Spanned<RawEtcd>>) -> Result<Etcd, ConfigError> {
    let Some(raw) = raw else {
        return Err(source.error(None, None, Some("etcd"), "missing [etcd] section"));
    };
    let table_span = raw.span();
    let raw = raw.into_inner();
    let endpoints = raw.endpoints.ok_or_else(|| {
        source.error(
            Some(table_span.clone()),
            None,
            Some("etcd.endpoints"),
            "missing etcd endpoints",
        )
    })?;
    if endpoints.get_ref().iter().all(|endpoint| endpoint.trim().is_empty()) {
        return Err(source.error(
            Some(endpoints.span()),
            None,
            Some("etcd.endpoints"),
            "at least one etcd endpoint is required",
        ));
    }
    if let Some(password_env) = &raw.password_env {
        if raw.username.is_none() {
            return Err(source.error(
                Some(password_env.span()),
                None,
                Some("etcd.password_env"),
                "password_env needs a username",
            ));
        }
    }
    Ok(Etcd {
        endpoints: endpoints.into_inner(),
        username: raw.username.map(Spanned::into_inner),
        password_env: raw.password_env.map(Spanned::into_inner),
        tls: raw.tls.map(|tls| EtcdTls {
            ca: tls.ca,
            cert: tls.cert,
            key: tls.key,
        }),
    })
}

fn validate_job(
    source: &Source,
    cluster: &Cluster,
    name: Spanned<String>,
    raw: Spanned<RawJob>,
    schedules: &mut HashMap<(String, Tz), Arc<Schedule>>,
) -> Result<Job, ConfigError> {
    let name_span = name.span();
    let name = name.into_inner();
    let job = Some(name.as_str());
    if !valid_name(&name) || name.len() > MAX_JOB_NAME {
        return Err(source.error(
            Some(name_span),
            job,
            None,
            format!("invalid job name: use at most {MAX_JOB_NAME} letters, digits, '.', '_' and '-'"),
        ));
    }
    let table_span = raw.span();
    let raw = raw.into_inner();

    let timezone = match &raw.timezone {
        Some(value) => parse_zone(value.get_ref())
            .map_err(|message| source.error(Some(value.span()), job, Some("timezone"), message))?,
        None => cluster.timezone,
    };
    let expression = raw
        .schedule
        .ok_or_else(|| source.error(Some(table_span.clone()), job, Some("schedule"), "missing schedule"))?;
    let key = (expression.get_ref().trim().to_string(), timezone);
    let schedule = match schedules.get(&key) {
        Some(schedule) => Arc::clone(schedule),
        None => {
            let parsed = Schedule::parse(expression.get_ref(), timezone)
                .map_err(|err| source.error(Some(expression.span()), job, Some("schedule"), err.to_string()))?;
            let parsed = Arc::new(parsed);
            schedules.insert(key, Arc::clone(&parsed));
            parsed
        }
    };
    let command = raw
        .command
        .ok_or_else(|| source.error(Some(table_span.clone()), job, Some("command"), "missing command"))?;
    if command.get_ref().trim().is_empty() {
        return Err(source.error(Some(command.span()), job, Some("command"), "command is empty"));
    }
    let timeout = raw
        .timeout
        .as_ref()
        .map(|value| parse_duration(source, value, job, "timeout"))
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
        .map(|value| parse_duration(source, value, job, "kill_grace"))
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
        .map(|value| parse_duration(source, value, job, "retry_backoff"))
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
        .map(|value| parse_duration(source, value, job, "starting_deadline"))
        .transpose()?;
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
    Ok(Job {
        shard: shard_of(&name, cluster.shards),
        name,
        schedule,
        command: command.into_inner(),
        timeout,
        kill_grace,
        retries,
        retry_backoff,
        catch_up: raw.catch_up.map(Spanned::into_inner).unwrap_or_default(),
        starting_deadline,
        overlap: raw.overlap.map(Spanned::into_inner).unwrap_or_default(),
        working_dir: raw.working_dir.map(Spanned::into_inner),
        env: raw.env.map(Spanned::into_inner).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests;
