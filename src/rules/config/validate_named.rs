//! The named tables jobs refer to: `[blackouts.<name>]` and `[notify.<name>]`, validated once,
//! and the lists of their names that `[cluster]` and each job give.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono_tz::Tz;
use toml::Spanned;

use super::error::{ConfigError, Source};
use super::model::{Cluster, Etcd, GroupsByName};
use super::raw::{RawBlackout, RawHeader, RawNames, RawNotify, RawWindow};
use super::validate::{parse_duration, secret_path, valid_name};
use crate::rules::blackouts::{
    Blackout, Window, MAX_BLACKOUTS, MAX_BLACKOUTS_PER_JOB, MAX_DATES, MAX_WINDOW, MAX_WINDOWS,
};
use crate::rules::notify::{check_url, Event, HeaderValue, Notifier, MAX_HEADERS, MAX_NOTIFIERS};
use crate::rules::own_secrets::OwnSecrets;
use crate::rules::schedule::{parse_zone, Schedule};

/// Blackout and notifier names become metric labels and log fields.
const MAX_TABLE_NAME: usize = 64;

/// What the file defines once for many jobs, and what `[cluster]` applies to all of them.
pub(super) struct Shared {
    pub(super) groups: GroupsByName,
    pub(super) blackouts: BTreeMap<String, Arc<Blackout>>,
    pub(super) notifiers: BTreeMap<String, Arc<Notifier>>,
    /// `[cluster] blackouts`, resolved.
    pub(super) every_job_blackouts: Vec<Arc<Blackout>>,
    /// `[cluster] notify`, resolved.
    pub(super) every_job_notify: Vec<Arc<Notifier>>,
}

impl Shared {
    /// Validates the named tables and resolves `[cluster] blackouts` and `notify`, taken out of
    /// the raw cluster table before it was validated.
    pub(super) fn validate(
        source: &Source,
        cluster: &Cluster,
        etcd: &Etcd,
        raw: SharedTables,
        lists: (Option<RawNames>, Option<RawNames>),
    ) -> Result<Shared, ConfigError> {
        let groups = super::validate::validate_groups(source, raw.groups)?;
        let blackouts = validate_blackouts(source, cluster, raw.blackouts)?;
        let notifiers = validate_notifiers(source, raw.notify, &etcd.own_secrets())?;
        let every_job_blackouts = resolve(source, None, "blackouts", lists.0.as_ref(), &blackouts, &[])?;
        let every_job_notify = resolve(source, None, "notify", lists.1.as_ref(), &notifiers, &[])?;
        Ok(Shared {
            groups,
            blackouts,
            notifiers,
            every_job_blackouts,
            every_job_notify,
        })
    }
}

/// The raw named tables of the file.
pub(super) struct SharedTables {
    pub(super) groups: BTreeMap<Spanned<String>, Spanned<super::raw::RawGroup>>,
    pub(super) blackouts: BTreeMap<Spanned<String>, Spanned<RawBlackout>>,
    pub(super) notify: BTreeMap<Spanned<String>, Spanned<RawNotify>>,
}

/// Takes `[cluster] blackouts` and `notify` out of the raw cluster table.
pub(super) fn cluster_lists(
    cluster: &mut Option<Spanned<super::raw::RawCluster>>,
) -> (Option<RawNames>, Option<RawNames>) {
    match cluster {
        Some(cluster) => {
            let cluster = cluster.get_mut();
            (cluster.blackouts.take(), cluster.notify.take())
        }
        None => (None, None),
    }
}

/// `[blackouts.<name>]`: each covers some time, every window ends, dates are real days.
pub(super) fn validate_blackouts(
    source: &Source,
    cluster: &Cluster,
    raw: BTreeMap<Spanned<String>, Spanned<RawBlackout>>,
) -> Result<BTreeMap<String, Arc<Blackout>>, ConfigError> {
    if raw.len() > MAX_BLACKOUTS {
        return Err(source.error(
            raw.keys().nth(MAX_BLACKOUTS).map(Spanned::span),
            None,
            Some("blackouts"),
            format!("{} blackouts; at most {MAX_BLACKOUTS}", raw.len()),
        ));
    }
    let mut blackouts = BTreeMap::new();
    for (name, blackout) in raw {
        let (name_span, name) = (name.span(), name.into_inner());
        table_name(source, name_span, &name, "blackouts")?;
        let field = |what: &str| format!("blackouts.{name}.{what}");
        let (table_span, blackout) = (blackout.span(), blackout.into_inner());
        let zone = match &blackout.timezone {
            Some(value) => parse_zone(value.get_ref())
                .map_err(|message| source.error(Some(value.span()), None, Some(&field("timezone")), message))?,
            None => cluster.timezone,
        };
        let windows = blackout_windows(source, &field, blackout.windows, zone)?;
        let dates = blackout_dates(source, &field, blackout.dates)?;
        if windows.is_empty() && dates.is_empty() {
            return Err(source.error(
                Some(table_span),
                None,
                Some(&format!("blackouts.{name}")),
                "the blackout covers no time: give windows = [{ start = \"...\", duration = \"...\" }] or dates = [\"YYYY-MM-DD\"]",
            ));
        }
        blackouts.insert(
            name.clone(),
            Arc::new(Blackout {
                name,
                windows,
                dates,
                zone,
            }),
        );
    }
    Ok(blackouts)
}

/// A blackout's `windows`, each start parsed in the blackout's `zone`.
fn blackout_windows(
    source: &Source,
    field: &impl Fn(&str) -> String,
    windows: Option<Spanned<Vec<Spanned<RawWindow>>>>,
    zone: Tz,
) -> Result<Vec<Window>, ConfigError> {
    let Some(windows) = windows else {
        return Ok(Vec::new());
    };
    if windows.get_ref().len() > MAX_WINDOWS {
        return Err(source.error(
            Some(windows.span()),
            None,
            Some(&field("windows")),
            format!("{} windows; at most {MAX_WINDOWS}", windows.get_ref().len()),
        ));
    }
    let mut valid = Vec::new();
    for window in windows.into_inner() {
        let (span, window) = (window.span(), window.into_inner());
        let missing = |what: &str, why: &str| {
            source.error(Some(span.clone()), None, Some(&field(&format!("windows.{what}"))), why)
        };
        let start = window.start.ok_or_else(|| {
            missing(
                "start",
                "missing start: the crontab expression at whose instants the window opens",
            )
        })?;
        let duration = window.duration.ok_or_else(|| {
            missing(
                "duration",
                "missing duration: a window that never ends is a pause (shardcron pause)",
            )
        })?;
        let schedule = Schedule::parse(start.get_ref(), zone)
            .map_err(|err| source.error(Some(start.span()), None, Some(&field("windows.start")), err.to_string()))?;
        let length = parse_duration(source, &duration, None, &field("windows.duration"), MAX_WINDOW)?;
        if length.is_zero() {
            return Err(source.error(
                Some(duration.span()),
                None,
                Some(&field("windows.duration")),
                "a window of no time covers no tick: give a duration such as \"2h\"",
            ));
        }
        valid.push(Window {
            start: Arc::new(schedule),
            duration: chrono::Duration::from_std(length).unwrap_or(chrono::Duration::MAX),
        });
    }
    Ok(valid)
}

/// A blackout's `dates`, each a whole day.
fn blackout_dates(
    source: &Source,
    field: &impl Fn(&str) -> String,
    raw_dates: Option<Spanned<Vec<Spanned<String>>>>,
) -> Result<BTreeSet<chrono::NaiveDate>, ConfigError> {
    let mut dates = BTreeSet::new();
    let Some(raw_dates) = raw_dates else {
        return Ok(dates);
    };
    if raw_dates.get_ref().len() > MAX_DATES {
        return Err(source.error(
            Some(raw_dates.span()),
            None,
            Some(&field("dates")),
            format!("{} dates; at most {MAX_DATES}", raw_dates.get_ref().len()),
        ));
    }
    for date in raw_dates.into_inner() {
        let day = chrono::NaiveDate::parse_from_str(date.get_ref(), "%Y-%m-%d").map_err(|_| {
            source.error(
                Some(date.span()),
                None,
                Some(&field("dates")),
                format!("{:?} is not a date: write it as YYYY-MM-DD", date.get_ref()),
            )
        })?;
        dates.insert(day);
    }
    Ok(dates)
}

/// `[notify.<name>]`: a URL, headers whose secret values stay out of the file and never come
/// from the node's `own` secrets, and the events wanted.
pub(super) fn validate_notifiers(
    source: &Source,
    raw: BTreeMap<Spanned<String>, Spanned<RawNotify>>,
    own: &OwnSecrets,
) -> Result<BTreeMap<String, Arc<Notifier>>, ConfigError> {
    if raw.len() > MAX_NOTIFIERS {
        return Err(source.error(
            raw.keys().nth(MAX_NOTIFIERS).map(Spanned::span),
            None,
            Some("notify"),
            format!("{} notifiers; at most {MAX_NOTIFIERS}", raw.len()),
        ));
    }
    let mut notifiers = BTreeMap::new();
    for (name, notify) in raw {
        let (name_span, name) = (name.span(), name.into_inner());
        table_name(source, name_span, &name, "notify")?;
        let field = |what: &str| format!("notify.{name}.{what}");
        let (table_span, notify) = (notify.span(), notify.into_inner());
        let url = notify.url.ok_or_else(|| {
            source.error(
                Some(table_span),
                None,
                Some(&field("url")),
                "missing url: where to POST the events",
            )
        })?;
        check_url(url.get_ref()).map_err(|why| source.error(Some(url.span()), None, Some(&field("url")), why))?;
        let headers = notifier_headers(source, &field, notify.headers, own)?;
        let on = notifier_events(source, &field, notify.on)?;
        notifiers.insert(
            name.clone(),
            Arc::new(Notifier {
                name,
                url: url.into_inner(),
                headers,
                on,
            }),
        );
    }
    Ok(notifiers)
}

/// A notifier's `headers`: each name checked, each value written out or read from the
/// node's environment or a file at each send, never from what the node keeps to itself.
fn notifier_headers(
    source: &Source,
    field: &impl Fn(&str) -> String,
    raw_headers: Option<Spanned<BTreeMap<String, Spanned<RawHeader>>>>,
    own: &OwnSecrets,
) -> Result<Vec<(String, HeaderValue)>, ConfigError> {
    let mut headers = Vec::new();
    let Some(raw_headers) = raw_headers else {
        return Ok(headers);
    };
    if raw_headers.get_ref().len() > MAX_HEADERS {
        return Err(source.error(
            Some(raw_headers.span()),
            None,
            Some(&field("headers")),
            format!("{} headers; at most {MAX_HEADERS}", raw_headers.get_ref().len()),
        ));
    }
    for (header, value) in raw_headers.into_inner() {
        let header_field = field(&format!("headers.{header}"));
        let span = value.span();
        let error = |why: &str| source.error(Some(span.clone()), None, Some(&header_field), why);
        if header.is_empty() || !header.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(error("a header name is letters, digits and '-'"));
        }
        let value = match value.into_inner() {
            RawHeader::Text(text) if text.bytes().any(|b| b.is_ascii_control()) => {
                return Err(error("the value holds a control character"))
            }
            RawHeader::Text(text) => HeaderValue::Text(text),
            RawHeader::From(from) => match (from.env, from.file) {
                (Some(env), None) if !env.is_empty() => HeaderValue::Env(env),
                (None, Some(file)) => {
                    secret_path(source, &Spanned::new(span.clone(), file.clone()), None, &header_field)?;
                    HeaderValue::File(file)
                }
                _ => {
                    return Err(error(
                        "give the value as a string, { env = \"NAME\" } or { file = \"/path\" }",
                    ))
                }
            },
        };
        let refused = match &value {
            HeaderValue::Env(var) => own.refuse_env(var),
            HeaderValue::File(path) => own.refuse_file(path),
            HeaderValue::Text(_) => None,
        };
        if let Some(why) = refused {
            return Err(error(&why));
        }
        headers.push((header, value));
    }
    Ok(headers)
}

/// A notifier's `on`: the events it wants, [`Event::DEFAULT`] when not given.
fn notifier_events(
    source: &Source,
    field: &impl Fn(&str) -> String,
    on: Option<Spanned<Vec<Spanned<String>>>>,
) -> Result<BTreeSet<Event>, ConfigError> {
    Ok(match on {
        None => Event::DEFAULT.into_iter().collect(),
        Some(events) => {
            let mut on = BTreeSet::new();
            for event in events.into_inner() {
                let parsed = Event::parse(event.get_ref()).ok_or_else(|| {
                    let known: Vec<&str> = Event::ALL.iter().map(|event| event.as_str()).collect();
                    source.error(
                        Some(event.span()),
                        None,
                        Some(&field("on")),
                        format!("unknown event {:?}: one of {}", event.get_ref(), known.join(", ")),
                    )
                })?;
                on.insert(parsed);
            }
            on
        }
    })
}

fn table_name(source: &Source, span: std::ops::Range<usize>, name: &str, table: &str) -> Result<(), ConfigError> {
    if valid_name(name) && name.len() <= MAX_TABLE_NAME {
        return Ok(());
    }
    Err(source.error(
        Some(span),
        None,
        Some(&format!("{table}.{name}")),
        format!("invalid name: use at most {MAX_TABLE_NAME} letters, digits, '.', '_' and '-' (not \".\" or \"..\")"),
    ))
}

/// The tables `names` lists, after `first` (the cluster's), each once, in order; an unknown name
/// is refused with the names the file defines.
pub(super) fn resolve<T>(
    source: &Source,
    job: Option<&str>,
    field: &str,
    names: Option<&RawNames>,
    defined: &BTreeMap<String, Arc<T>>,
    first: &[Arc<T>],
) -> Result<Vec<Arc<T>>, ConfigError> {
    let mut resolved: Vec<Arc<T>> = first.to_vec();
    let Some(names) = names else { return Ok(resolved) };
    for name in names.get_ref() {
        let table = defined.get(name.get_ref()).ok_or_else(|| {
            let known: Vec<&str> = defined.keys().map(String::as_str).take(10).collect();
            let known = match known.is_empty() {
                true => format!("the file defines no [{field}.<name>]"),
                false => format!("{field} defined: {}", known.join(", ")),
            };
            source.error(
                Some(name.span()),
                job,
                Some(field),
                format!(
                    "unknown name {:?}: {known}{}",
                    name.get_ref(),
                    crate::rules::suggest::did_you_mean(name.get_ref(), defined.keys().map(String::as_str))
                ),
            )
        })?;
        if !resolved.iter().any(|known| Arc::ptr_eq(known, table)) {
            resolved.push(Arc::clone(table));
        }
    }
    if resolved.len() > MAX_BLACKOUTS_PER_JOB {
        return Err(source.error(
            Some(names.span()),
            job,
            Some(field),
            format!(
                "{} names with the cluster's; at most {MAX_BLACKOUTS_PER_JOB}",
                resolved.len()
            ),
        ));
    }
    Ok(resolved)
}
