//! Field-by-field checks that turn the raw shapes into the validated model: `[cluster]`,
//! `[etcd]`, and the checks every section shares. A job's are in `validate_job`.

use std::path::PathBuf;
use std::time::Duration;

use chrono_tz::Tz;
use toml::Spanned;

use super::error::{ConfigError, Source};
use super::model::*;
use super::raw::*;
use crate::rules::bounds;
use crate::rules::groups::{Group, MAX_GROUPS, MAX_GROUP_NAME, MAX_LIMIT};
use crate::rules::pools::DEFAULT_POOL_SHARDS;
use crate::rules::schedule::parse_zone;

/// A duration field of at most `max` ([`bounds::MAX_WINDOW`] for spans, [`bounds::MAX_WAIT`]
/// for waits).
pub(super) fn parse_duration(
    source: &Source,
    value: &Spanned<String>,
    job: Option<&str>,
    field: &str,
    max: Duration,
) -> Result<Duration, ConfigError> {
    bounds::parse(value.get_ref(), max).map_err(|err| {
        source.error(
            Some(value.span()),
            job,
            Some(field),
            format!("invalid duration {:?}: {err}", value.get_ref()),
        )
    })
}

/// A job, group or node name: letters, digits, `.`, `_` and `-`, but not `.` or `..`, which
/// a URL path (`/api/v1/jobs/<name>/pause`) or a file path would read as a directory.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `[cluster] <name>`, a count within `range` (`unit` follows the bounds in the error).
fn count_within(
    source: &Source,
    value: &Spanned<i64>,
    name: &str,
    range: std::ops::RangeInclusive<i64>,
    unit: &str,
) -> Result<u32, ConfigError> {
    if range.contains(value.get_ref()) {
        return Ok(*value.get_ref() as u32);
    }
    Err(source.error(
        Some(value.span()),
        None,
        Some(&format!("cluster.{name}")),
        format!(
            "{name} must be between {} and {}{unit}, found {}",
            range.start(),
            range.end(),
            value.get_ref()
        ),
    ))
}

pub(super) fn validate_cluster(source: &Source, raw: Option<Spanned<RawCluster>>) -> Result<Cluster, ConfigError> {
    let Some(raw) = raw else {
        return Err(source.error(
            None,
            None,
            Some("cluster"),
            "missing [cluster] section: add one with name = \"...\" and shards = N (see config/jobs.toml)",
        ));
    };
    let table_span = raw.span();
    let raw = raw.into_inner();
    let field = |name: &str, message: String| source.error(Some(table_span.clone()), None, Some(name), message);

    let name = raw.name.ok_or_else(|| {
        field(
            "cluster.name",
            "missing cluster name: add name = \"...\" (its etcd prefix; letters, digits, '.', '_', '-')".into(),
        )
    })?;
    if !valid_name(name.get_ref()) {
        return Err(source.error(
            Some(name.span()),
            None,
            Some("cluster.name"),
            format!(
                "invalid cluster name {:?}: use letters, digits, '.', '_' and '-' (not \".\" or \"..\")",
                name.get_ref()
            ),
        ));
    }
    let shards = raw.shards.ok_or_else(|| {
        field(
            "cluster.shards",
            "missing shard count: add shards = N (1 to 4096; 8 is a fine start)".into(),
        )
    })?;
    let shards = count_within(source, &shards, "shards", 1..=i64::from(MAX_SHARDS), "")?;
    let lease_ttl = match &raw.lease_ttl {
        Some(value) => parse_duration(source, value, None, "cluster.lease_ttl", bounds::MAX_WAIT)?,
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
    let history = match &raw.history {
        Some(value) => count_within(source, value, "history", 0..=MAX_HISTORY, " runs per job")?,
        None => DEFAULT_HISTORY,
    };
    let pool_shards = match &raw.pool_shards {
        Some(value) => count_within(source, value, "pool_shards", 1..=i64::from(MAX_SHARDS), "")?,
        None => DEFAULT_POOL_SHARDS,
    };
    Ok(Cluster {
        name: name.into_inner(),
        shards,
        lease_ttl,
        timezone,
        history,
        pool_shards,
    })
}

/// `[groups.<name>]`: each a name fit for a key and a label, a `limit` and an optional `wait`.
pub(super) fn validate_groups(
    source: &Source,
    raw: std::collections::BTreeMap<Spanned<String>, Spanned<RawGroup>>,
) -> Result<GroupsByName, ConfigError> {
    if raw.len() > MAX_GROUPS {
        return Err(source.error(
            raw.keys().nth(MAX_GROUPS).map(Spanned::span),
            None,
            Some("groups"),
            format!("{} groups; at most {MAX_GROUPS}", raw.len()),
        ));
    }
    let mut groups = GroupsByName::new();
    for (name, group) in raw {
        let (name_span, name) = (name.span(), name.into_inner());
        let field = |what: &str| format!("groups.{name}.{what}");
        if !valid_name(&name) || name.len() > MAX_GROUP_NAME {
            return Err(source.error(
                Some(name_span),
                None,
                Some(&format!("groups.{name}")),
                format!("invalid group name: use at most {MAX_GROUP_NAME} letters, digits, '.', '_' and '-' (not \".\" or \"..\")"),
            ));
        }
        let (table_span, group) = (group.span(), group.into_inner());
        let limit = group.limit.ok_or_else(|| {
            source.error(
                Some(table_span),
                None,
                Some(&field("limit")),
                "missing limit: how many of the group's runs may go at once",
            )
        })?;
        if !(1..=i64::from(MAX_LIMIT)).contains(limit.get_ref()) {
            return Err(source.error(
                Some(limit.span()),
                None,
                Some(&field("limit")),
                format!("limit must be between 1 and {MAX_LIMIT}, found {}", limit.get_ref()),
            ));
        }
        let wait = match &group.wait {
            Some(value) => Some(parse_duration(source, value, None, &field("wait"), bounds::MAX_WAIT)?),
            None => None,
        };
        let limit = *limit.get_ref() as u32;
        groups.insert(name.clone(), std::sync::Arc::new(Group { name, limit, wait }));
    }
    Ok(groups)
}

pub(super) fn validate_etcd(source: &Source, raw: Option<Spanned<RawEtcd>>) -> Result<Etcd, ConfigError> {
    let Some(raw) = raw else {
        return Err(source.error(
            None,
            None,
            Some("etcd"),
            "missing [etcd] section: add one with endpoints = [\"http://127.0.0.1:2379\"]",
        ));
    };
    let table_span = raw.span();
    let raw = raw.into_inner();
    let endpoints = raw.endpoints.clone().ok_or_else(|| {
        source.error(
            Some(table_span.clone()),
            None,
            Some("etcd.endpoints"),
            "missing etcd endpoints: add endpoints = [\"http://127.0.0.1:2379\"] (every member's client URL)",
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
    validate_credentials(source, &raw)?;
    let tls = match raw.tls {
        Some(tls) => Some(validate_tls(source, tls)?),
        None => None,
    };
    let compaction = validate_compaction(source, raw.compaction.as_ref())?;
    let gone_node_retention = validate_gone_node_retention(source, raw.gone_node_retention.as_ref())?;
    Ok(Etcd {
        endpoints: endpoints.into_inner(),
        username: raw.username.map(Spanned::into_inner),
        password_env: raw.password_env.map(Spanned::into_inner),
        password_file: raw.password_file.map(Spanned::into_inner),
        tls,
        compaction,
        gone_node_retention,
    })
}

/// `[etcd] gone_node_retention`: a duration within [`MIN_GONE_NODE_RETENTION`] and
/// [`MAX_GONE_NODE_RETENTION`].
fn validate_gone_node_retention(source: &Source, value: Option<&Spanned<String>>) -> Result<Duration, ConfigError> {
    let Some(value) = value else {
        return Ok(DEFAULT_GONE_NODE_RETENTION);
    };
    const FIELD: &str = "etcd.gone_node_retention";
    let retention = parse_duration(source, value, None, FIELD, MAX_GONE_NODE_RETENTION)?;
    if retention < MIN_GONE_NODE_RETENTION {
        return Err(source.error(
            Some(value.span()),
            None,
            Some(FIELD),
            format!(
                "gone_node_retention must be at least {}, found {:?}",
                humantime::format_duration(MIN_GONE_NODE_RETENTION),
                value.get_ref()
            ),
        ));
    }
    Ok(retention)
}

/// A password comes one way, and only with a username to go with it.
fn validate_credentials(source: &Source, raw: &RawEtcd) -> Result<(), ConfigError> {
    if let Some(password_env) = &raw.password_env {
        if raw.username.is_none() {
            return Err(source.error(
                Some(password_env.span()),
                None,
                Some("etcd.password_env"),
                "password_env needs a username",
            ));
        }
        if let Some(password_file) = &raw.password_file {
            return Err(source.error(
                Some(password_file.span()),
                None,
                Some("etcd.password_file"),
                "give the password one way: password_env or password_file, not both",
            ));
        }
    }
    if let Some(password_file) = &raw.password_file {
        if raw.username.is_none() {
            return Err(source.error(
                Some(password_file.span()),
                None,
                Some("etcd.password_file"),
                "password_file needs a username",
            ));
        }
        secret_path(source, password_file, None, "etcd.password_file")?;
    }
    Ok(())
}

/// `[etcd] compaction`: `"off"`, or how often, at least [`MIN_COMPACTION`].
fn validate_compaction(source: &Source, compaction: Option<&Spanned<String>>) -> Result<Option<Duration>, ConfigError> {
    Ok(match compaction {
        None => Some(DEFAULT_COMPACTION),
        Some(value) if value.get_ref().trim() == "off" => None,
        Some(value) => {
            let every = parse_duration(source, value, None, "etcd.compaction", bounds::MAX_WAIT)?;
            if every < MIN_COMPACTION {
                return Err(source.error(
                    Some(value.span()),
                    None,
                    Some("etcd.compaction"),
                    format!(
                        "compaction must be \"off\" or at least {}, found {:?}",
                        humantime::format_duration(MIN_COMPACTION),
                        value.get_ref()
                    ),
                ));
            }
            Some(every)
        }
    })
}

/// A client certificate needs its key and a key its certificate: either alone would be dropped,
/// and the node would connect without the identity the operator meant it to have.
fn validate_tls(source: &Source, raw: RawTls) -> Result<EtcdTls, ConfigError> {
    let missing = match (&raw.cert, &raw.key) {
        (Some(cert), None) => Some((
            cert.span(),
            "etcd.tls.cert",
            "cert needs key (the client certificate's private key)",
        )),
        (None, Some(key)) => Some((
            key.span(),
            "etcd.tls.key",
            "key needs cert (the client certificate it belongs to)",
        )),
        _ => None,
    };
    if let Some((span, field, message)) = missing {
        return Err(source.error(Some(span), None, Some(field), message));
    }
    Ok(EtcdTls {
        ca: raw.ca,
        cert: raw.cert.map(Spanned::into_inner),
        key: raw.key.map(Spanned::into_inner),
    })
}

/// A path to a secret file: absolute, since a node's working directory differs between a shell
/// and its unit, and without a NUL byte, which no path can hold.
pub(super) fn secret_path(
    source: &Source,
    path: &Spanned<PathBuf>,
    job: Option<&str>,
    field: &str,
) -> Result<(), ConfigError> {
    let error = |message: &str| Err(source.error(Some(path.span()), job, Some(field), message));
    if path.get_ref().as_os_str().as_encoded_bytes().contains(&0) {
        return error("the path holds a NUL byte");
    }
    if !path.get_ref().is_absolute() {
        return error("the path must be absolute, such as /etc/shardcron/secrets/NAME");
    }
    Ok(())
}
