//! Notifications: which runs of a job are worth telling someone about, and what is kept in etcd
//! so that each is told once across nodes that die.
//!
//! An event is a transition, not every run: the first failure after a success (`failure`), the
//! first success after a failure (`recovered`), and each `lost`, `skipped` or `group_full` run.
//! The job's notification record says whether the job is failing, the fence of the last run it
//! accounted for, the events not yet delivered and the last one that was; a run is accounted
//! for once, by its fence, so a record written twice never makes two events.
//!
//! Pure: what etcd holds and the instant are passed in.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::rules::record::{Outcome, RunRecord, Trigger};

/// At most this many `[notify.<name>]` tables in a file.
pub const MAX_NOTIFIERS: usize = 64;
/// At most this many headers on one notifier.
pub const MAX_HEADERS: usize = 32;
/// An event not delivered this long after it happened is given up on: logged and counted.
pub const DELIVERY_PATIENCE: Duration = Duration::from_secs(10 * 60);
/// How long one delivery attempt (or one success ping) may take.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// At most this many undelivered events kept per job: a receiver down for hours while a job
/// flaps must not grow its record without bound; the oldest go first, counted `dropped`.
pub const MAX_PENDING: usize = 32;
/// At most this many bytes of each output stream in a notification's body.
pub const MAX_BODY_OUTPUT: usize = 4096;
/// At most this many bytes of a job's record as JSON: well under etcd's default request
/// limit (1.5 MiB), which output that escapes to 6 bytes a character could pass with
/// [`MAX_PENDING`] events of [`MAX_BODY_OUTPUT`] each.
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;
/// The end of each stream an undelivered event keeps once the record is past
/// [`MAX_RECORD_BYTES`]: the oldest events are cut to it first.
pub const SHORT_OUTPUT: usize = 256;

/// What a notifier may be told about (`on = [...]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// The first failed run after a success (or the job's first run, failed).
    Failure,
    /// The first successful run after a failure.
    Recovered,
    /// Each tick recorded `lost`.
    Lost,
    /// Each tick recorded `skipped` (a run still going, a blackout).
    Skipped,
    /// Each tick recorded `group_full`.
    GroupFull,
    /// Ticks that passed while the job's shard had no leader and were not caught up.
    Missed,
}

impl Event {
    pub const ALL: [Event; 6] = [
        Event::Failure,
        Event::Recovered,
        Event::Lost,
        Event::Skipped,
        Event::GroupFull,
        Event::Missed,
    ];

    /// The default `on`.
    pub const DEFAULT: [Event; 3] = [Event::Failure, Event::Recovered, Event::Lost];

    pub fn as_str(self) -> &'static str {
        match self {
            Event::Failure => "failure",
            Event::Recovered => "recovered",
            Event::Lost => "lost",
            Event::Skipped => "skipped",
            Event::GroupFull => "group_full",
            Event::Missed => "missed",
        }
    }

    pub fn parse(text: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|event| event.as_str() == text)
    }
}

/// `ping_method`: how a success ping is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PingMethod {
    #[default]
    Get,
    Post,
}

/// A validated `[notify.<name>]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Notifier {
    pub name: String,
    /// An `http://` or `https://` URL.
    pub url: String,
    pub headers: Vec<(String, HeaderValue)>,
    pub on: BTreeSet<Event>,
}

impl Notifier {
    /// The host this notifier sends header values read from the node's secrets (`env` or
    /// `file`) to over plain `http://`, unless it is this machine: anyone on the way reads them.
    pub fn secrets_in_the_clear(&self) -> Option<&str> {
        let rest = self.url.strip_prefix("http://")?;
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let host_port = authority.rsplit('@').next().unwrap_or_default();
        let host = match host_port.strip_prefix('[') {
            Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
            None => host_port.split(':').next().unwrap_or_default(),
        };
        let loopback = host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|address| address.is_loopback());
        let secret = self
            .headers
            .iter()
            .any(|(_, value)| matches!(value, HeaderValue::Env(_) | HeaderValue::File(_)));
        (secret && !loopback).then_some(host)
    }

    /// What an operator should hear about this notifier without it being an error.
    pub fn warnings(&self) -> Vec<String> {
        self.secrets_in_the_clear()
            .map(|host| {
                format!(
                    "notifier {:?} sends header values from env or file over plain http:// to {host}: anyone on the way reads them; use https:// (a receiver with an internal CA: install that CA into the system's trust store, which nodes trust beside the public roots)",
                    self.name
                )
            })
            .into_iter()
            .collect()
    }
}

/// Where a header's value comes from; the value itself is never printed.
#[derive(Clone, PartialEq, Eq)]
pub enum HeaderValue {
    Text(String),
    /// The node's environment variable of this name, read at each send.
    Env(String),
    /// The whole file (its last newline cut), read at each send.
    File(PathBuf),
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may hold a token (`https://hc-ping.com/<uuid>`), as the headers may.
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("Notifier")
            .field("name", &self.name)
            .field("headers", &headers)
            .field("on", &self.on)
            .finish_non_exhaustive()
    }
}

/// The URL with its path, query and credentials left out: what a log line may show.
pub fn url_origin(url: &str) -> &str {
    let after_scheme = url.find("://").map_or(0, |at| at + 3);
    let end = url[after_scheme..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |at| after_scheme + at);
    // Credentials may stand in the authority, and a password may hold a '/': with any '@' in
    // the URL, show only the scheme, which says little and leaks none.
    match url.contains('@') {
        true => &url[..after_scheme],
        false => &url[..end],
    }
}

/// Checks a notifier's or a ping's URL: `http://` or `https://` with a host, at most 2,048
/// bytes, no whitespace or control characters.
pub fn check_url(url: &str) -> Result<(), String> {
    if url.len() > 2048 {
        return Err(format!("the URL is {} bytes long; at most 2048", url.len()));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("the URL holds whitespace or a control character".into());
    }
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("the URL must start with http:// or https://")?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.rsplit('@').next().unwrap_or_default().is_empty() {
        return Err("the URL names no host".into());
    }
    Ok(())
}

/// One event of one job for one notifier, kept in the job's record until it is delivered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub notifier: String,
    pub event: Event,
    /// The run's record, output tail included, as the body carries it.
    pub run: RunRecord,
    /// When the run's result was accounted for: delivery is given up
    /// [`DELIVERY_PATIENCE`] after it.
    pub since: DateTime<Utc>,
    /// The node delivering it: another node takes it over once that one left the fleet.
    pub node: String,
    /// For a `missed` event: how many ticks were left out; `run` is then the newest of them,
    /// never run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missed: usize,
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

fn is_zero_fence(fence: &i64) -> bool {
    *fence == 0
}

impl Pending {
    /// The same for every attempt to tell of one transition, so a receiver may drop a repeat:
    /// `job/tick/event` for a scheduled or manual run (a manual run's tick is its own
    /// instant) and a `missed` event; `job/tick/event/backfill/fence` for a backfill run, which
    /// runs a tick again and may fail as its first run did, and must not be dropped as a repeat
    /// of it (the fence is its claim's own revision).
    pub fn dedupe_key(&self, job: &str) -> String {
        let tick = self
            .run
            .scheduled_at
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let event = self.event.as_str();
        match self.run.trigger {
            Trigger::Backfill => format!("{job}/{tick}/{event}/backfill/{}", self.run.fence),
            Trigger::Schedule | Trigger::Manual => format!("{job}/{tick}/{event}"),
        }
    }
}

/// How the last delivery of a job's events went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sent {
    pub notifier: String,
    pub event: Event,
    pub scheduled_at: DateTime<Utc>,
    pub dedupe_key: String,
    pub at: DateTime<Utc>,
    /// `delivered`, or `gave_up` once [`DELIVERY_PATIENCE`] passed.
    pub result: String,
}

/// The value of `/notify/<job>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The job's last accounted run failed: its next success is `recovered`.
    #[serde(default)]
    pub failing: bool,
    /// The fence and tick of the last run written down; a run no later by (fence, tick) is not
    /// counted (a record pushed twice, a late result of an older run). Ticks claimed in one
    /// write share a fence, hence the tick.
    #[serde(default)]
    pub fence: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tick: Option<DateTime<Utc>>,
    /// The revision of the job's record the last `missed` event was told from: a leader that
    /// read the same one tells nothing more.
    #[serde(default, skip_serializing_if = "is_zero_fence")]
    pub missed_fence: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<Pending>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<Sent>,
}

/// What a run is, as far as notifications go.
fn event_of(run: &RunRecord, failing: bool) -> (Option<Event>, bool) {
    match run.outcome {
        Outcome::Exited if run.exit_code == Some(0) => (failing.then_some(Event::Recovered), false),
        Outcome::Exited | Outcome::Killed | Outcome::Timeout | Outcome::SpawnFailed => {
            ((!failing).then_some(Event::Failure), true)
        }
        Outcome::Lost => (Some(Event::Lost), failing),
        Outcome::Skipped => (Some(Event::Skipped), failing),
        Outcome::GroupFull => (Some(Event::GroupFull), failing),
        Outcome::Paused | Outcome::Replaced => (None, failing),
    }
}

/// Accounts for `run` in the job's `record`: whether the job is failing now, and the events for
/// those of `notifiers` that want them, delivered by `node`. `false` when the record need not be
/// written: the run changes nothing (a success after a success, a failure after a failure), or
/// it was accounted for before (it is no later by fence, then tick, than the last written: a
/// run that ended after a newer one was counted says nothing of the job now). A run asked for
/// by hand or by a backfill changes whether the job is failing as a scheduled run does.
pub fn account(record: &mut Record, run: &RunRecord, notifiers: &[&Notifier], node: &str, now: DateTime<Utc>) -> bool {
    if record
        .tick
        .is_some_and(|tick| (run.fence, run.scheduled_at) <= (record.fence, tick))
    {
        return false;
    }
    let (event, failing) = event_of(run, record.failing);
    if event.is_none() && failing == record.failing {
        // Most runs: nothing to write, so a job with notifiers costs etcd one read per run.
        return false;
    }
    record.fence = run.fence;
    record.tick = Some(run.scheduled_at);
    record.failing = failing;
    let Some(event) = event else { return true };
    push(record, event, run, 0, notifiers, node, now);
    true
}

fn push(
    record: &mut Record,
    event: Event,
    run: &RunRecord,
    missed: usize,
    notifiers: &[&Notifier],
    node: &str,
    now: DateTime<Utc>,
) {
    for notifier in notifiers.iter().filter(|notifier| notifier.on.contains(&event)) {
        record.pending.push(Pending {
            notifier: notifier.name.clone(),
            event,
            run: kept(run),
            since: now,
            node: node.to_string(),
            missed,
        });
    }
}

/// Accounts for `count` missed ticks a takeover leaves unrun, the newest at `newest`, fenced by
/// the revision of the job's record that takeover read (`fence`): a `missed` event, once per
/// record read, whoever tells it. Says nothing of whether the job fails.
#[allow(clippy::too_many_arguments)]
pub fn account_missed(
    record: &mut Record,
    newest: DateTime<Utc>,
    count: usize,
    fence: i64,
    notifiers: &[&Notifier],
    node: &str,
    now: DateTime<Utc>,
) -> bool {
    if fence <= record.missed_fence {
        return false;
    }
    record.missed_fence = fence;
    let never_run = RunRecord {
        scheduled_at: newest,
        fence,
        node: node.to_string(),
        outcome: Outcome::Lost,
        exit_code: None,
        duration_ms: 0,
        finished_at: now,
        attempts: 0,
        trigger: Trigger::Schedule,
        blackout: None,
        output: None,
    };
    push(record, Event::Missed, &never_run, count.max(1), notifiers, node, now);
    true
}

/// `run` as an undelivered event keeps it: the last [`MAX_BODY_OUTPUT`] bytes of each stream.
pub fn kept(run: &RunRecord) -> RunRecord {
    let mut run = run.clone();
    keep_last(&mut run, MAX_BODY_OUTPUT);
    run
}

/// Cuts each of `run`'s output streams to its last `bytes` bytes, where a character starts.
fn keep_last(run: &mut RunRecord, bytes: usize) {
    if let Some(output) = &mut run.output {
        for text in [&mut output.stdout, &mut output.stderr] {
            let mut start = text.len().saturating_sub(bytes);
            while !text.is_char_boundary(start) {
                start += 1;
            }
            text.drain(..start);
        }
    }
}

fn encoded_len<T: Serialize>(value: &T) -> usize {
    serde_json::to_vec(value).map_or(0, |bytes| bytes.len())
}

/// Bounds the undelivered events: drops the oldest past [`MAX_PENDING`], then, while the
/// record as JSON is past [`MAX_RECORD_BYTES`], cuts the output of the oldest to
/// [`SHORT_OUTPUT`] (an event without the end of its output still tells its transition), and
/// only then drops the oldest. Returns how many were dropped.
pub fn trim(record: &mut Record) -> usize {
    let over = record.pending.len().saturating_sub(MAX_PENDING);
    record.pending.drain(..over);
    let mut size = encoded_len(record);
    let mut cut = 0;
    while size > MAX_RECORD_BYTES && cut < record.pending.len() {
        let pending = &mut record.pending[cut];
        let before = encoded_len(pending);
        keep_last(&mut pending.run, SHORT_OUTPUT);
        size = size.saturating_sub(before.saturating_sub(encoded_len(pending)));
        cut += 1;
    }
    let mut dropped = over;
    while size > MAX_RECORD_BYTES && !record.pending.is_empty() {
        let oldest = record.pending.remove(0);
        // Its bytes and the comma between it and the next.
        size = size.saturating_sub(encoded_len(&oldest) + 1);
        dropped += 1;
    }
    dropped
}

/// The JSON body of a notification.
#[derive(Debug, Serialize)]
pub struct Body<'a> {
    pub job: &'a str,
    pub event: Event,
    pub tick: DateTime<Utc>,
    pub fence: i64,
    pub node: &'a str,
    /// `null` for a `missed` event: its ticks never ran.
    pub outcome: Option<Outcome>,
    pub exit: Option<i32>,
    pub duration_ms: u64,
    pub attempts: u32,
    pub trigger: Trigger,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blackout: Option<&'a str>,
    /// For a `missed` event: how many ticks were left out (counted up to 1,000); `tick` is the
    /// newest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missed: Option<usize>,
    pub stdout: &'a str,
    pub stderr: &'a str,
    pub dedupe_key: String,
}

impl<'a> Body<'a> {
    pub fn of(job: &'a str, pending: &'a Pending) -> Body<'a> {
        let run = &pending.run;
        Body {
            job,
            event: pending.event,
            tick: run.scheduled_at,
            fence: run.fence,
            node: &run.node,
            outcome: (pending.event != Event::Missed).then_some(run.outcome),
            exit: run.exit_code,
            duration_ms: run.duration_ms,
            attempts: run.attempts,
            trigger: run.trigger,
            blackout: run.blackout.as_deref(),
            missed: (pending.event == Event::Missed).then_some(pending.missed),
            stdout: run.output.as_ref().map_or("", |output| &output.stdout),
            stderr: run.output.as_ref().map_or("", |output| &output.stderr),
            dedupe_key: pending.dedupe_key(job),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notifier(on: &[Event]) -> Notifier {
        Notifier {
            name: "ops".into(),
            url: "http://127.0.0.1:1/hook".into(),
            headers: Vec::new(),
            on: on.iter().copied().collect(),
        }
    }

    fn run(fence: i64, outcome: Outcome, exit: Option<i32>) -> RunRecord {
        let at = DateTime::<Utc>::from_timestamp(1_800_000_000 + fence, 0).unwrap();
        RunRecord {
            outcome,
            exit_code: exit,
            ..RunRecord::for_tests(at, fence)
        }
    }

    #[test]
    fn three_failures_then_a_success_make_one_failure_and_one_recovery() {
        let ops = notifier(&Event::DEFAULT);
        let mut record = Record::default();
        let now = Utc::now();
        let mut written = Vec::new();
        for (fence, exit) in [(1, 0), (2, 1), (3, 1), (4, 2), (5, 0), (6, 0)] {
            if account(&mut record, &run(fence, Outcome::Exited, Some(exit)), &[&ops], "a", now) {
                written.push(fence);
            }
        }
        assert_eq!(written, [2, 5], "only the transitions are written");
        let events: Vec<(Event, i64)> = record.pending.iter().map(|p| (p.event, p.run.fence)).collect();
        assert_eq!(events, [(Event::Failure, 2), (Event::Recovered, 5)]);
        assert!(!record.failing);
    }

    #[test]
    fn a_run_accounted_for_once_makes_no_second_event() {
        let ops = notifier(&Event::DEFAULT);
        let mut record = Record::default();
        let now = Utc::now();
        let failed = run(7, Outcome::Timeout, None);
        assert!(account(&mut record, &failed, &[&ops], "a", now));
        assert!(!account(&mut record, &failed, &[&ops], "b", now));
        assert!(!account(&mut record, &run(6, Outcome::Lost, None), &[&ops], "b", now));
        assert_eq!(record.pending.len(), 1);
    }

    #[test]
    fn ticks_claimed_in_one_write_share_a_fence_and_are_each_told() {
        let ops = notifier(&Event::DEFAULT);
        let mut record = Record::default();
        let now = Utc::now();
        let at = |second: i64| DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap();
        let lost = |second: i64| RunRecord {
            scheduled_at: at(second),
            outcome: Outcome::Lost,
            exit_code: None,
            ..RunRecord::for_tests(at(second), 40)
        };
        for second in [1, 2, 3] {
            assert!(account(&mut record, &lost(second), &[&ops], "a", now), "tick {second}");
        }
        assert!(!account(&mut record, &lost(2), &[&ops], "a", now), "tick 2 again");
        assert_eq!(record.pending.len(), 3);
    }

    #[test]
    fn each_lost_run_is_an_event_and_only_notifiers_that_want_one_get_it() {
        let ops = notifier(&Event::DEFAULT);
        let chatty = Notifier {
            name: "chatty".into(),
            ..notifier(&[Event::Skipped])
        };
        let mut record = Record::default();
        let now = Utc::now();
        for (fence, outcome) in [
            (1, Outcome::Lost),
            (2, Outcome::Lost),
            (3, Outcome::Skipped),
            (4, Outcome::Paused),
        ] {
            account(&mut record, &run(fence, outcome, None), &[&ops, &chatty], "a", now);
        }
        let events: Vec<(&str, Event)> = record.pending.iter().map(|p| (p.notifier.as_str(), p.event)).collect();
        assert_eq!(
            events,
            [("ops", Event::Lost), ("ops", Event::Lost), ("chatty", Event::Skipped)]
        );
        assert!(
            !record.failing,
            "lost, skipped and paused ticks say nothing of whether the job fails"
        );
    }

    #[test]
    fn the_oldest_undelivered_events_go_past_the_bound() {
        let ops = notifier(&[Event::Lost]);
        let mut record = Record::default();
        for fence in 1..=(MAX_PENDING as i64 + 3) {
            account(&mut record, &run(fence, Outcome::Lost, None), &[&ops], "a", Utc::now());
        }
        assert_eq!(trim(&mut record), 3);
        assert_eq!(record.pending.len(), MAX_PENDING);
        assert_eq!(record.pending[0].run.fence, 4);
    }

    #[test]
    fn missed_ticks_are_told_once_per_record_read_and_leave_failing_as_it_was() {
        let pager = notifier(&[Event::Missed, Event::Failure]);
        let mut record = Record::default();
        let now = Utc::now();
        account(&mut record, &run(4, Outcome::Exited, Some(1)), &[&pager], "a", now);
        let newest = DateTime::<Utc>::from_timestamp(1_800_000_100, 0).unwrap();
        assert!(account_missed(&mut record, newest, 7, 10, &[&pager], "b", now));
        assert!(
            !account_missed(&mut record, newest, 7, 10, &[&pager], "c", now),
            "a second leader that read the same record"
        );
        assert!(record.failing);
        let missed = &record.pending[1];
        assert_eq!(
            (missed.event, missed.missed, missed.run.scheduled_at),
            (Event::Missed, 7, newest)
        );
        let body = serde_json::to_value(Body::of("j", missed)).unwrap();
        assert_eq!((body["missed"].as_u64(), body["outcome"].is_null()), (Some(7), true));
    }

    #[test]
    fn a_backfill_of_a_told_tick_has_a_key_of_its_own_and_scheduled_runs_keep_theirs() {
        let ops = notifier(&Event::DEFAULT);
        let mut record = Record::default();
        let now = Utc::now();
        let failed = run(9, Outcome::Exited, Some(1));
        account(&mut record, &failed, &[&ops], "a", now);
        account(&mut record, &run(10, Outcome::Exited, Some(0)), &[&ops], "a", now);
        let backfill = RunRecord {
            fence: 80,
            trigger: Trigger::Backfill,
            ..failed.clone()
        };
        assert!(
            account(&mut record, &backfill, &[&ops], "b", now),
            "a genuine transition"
        );
        let keys: Vec<String> = record.pending.iter().map(|p| p.dedupe_key("nightly")).collect();
        assert_eq!(
            keys,
            [
                "nightly/2027-01-15T08:00:09.000Z/failure",
                "nightly/2027-01-15T08:00:10.000Z/recovered",
                "nightly/2027-01-15T08:00:09.000Z/failure/backfill/80",
            ]
        );
        let stored: Record = serde_json::from_slice(&serde_json::to_vec(&record).unwrap()).unwrap();
        assert_eq!(
            stored.pending[2].dedupe_key("nightly"),
            keys[2],
            "the same at every attempt"
        );
    }

    #[test]
    fn a_record_of_binary_output_stays_under_its_byte_bound_and_keeps_every_event() {
        let ops = notifier(&[Event::Lost]);
        let mut record = Record::default();
        let binary: String = "\u{1}".repeat(MAX_BODY_OUTPUT);
        for fence in 1..=(MAX_PENDING as i64) {
            let mut lost = run(fence, Outcome::Lost, None);
            lost.output = Some(crate::rules::record::RunOutput {
                stdout: binary.clone(),
                stderr: binary.clone(),
                ..Default::default()
            });
            account(&mut record, &lost, &[&ops], "a", Utc::now());
        }
        let before = serde_json::to_vec(&record).unwrap().len();
        assert!(
            before > 3 * MAX_RECORD_BYTES / 2,
            "{before} bytes: past etcd's request limit"
        );
        assert_eq!(trim(&mut record), 0, "no event dropped");
        let after = serde_json::to_vec(&record).unwrap().len();
        assert!(after <= MAX_RECORD_BYTES, "{after} bytes");
        assert_eq!(record.pending.len(), MAX_PENDING);
        let newest = record.pending.last().and_then(|p| p.run.output.as_ref()).unwrap();
        assert_eq!(newest.stdout, binary, "the newest event keeps its whole tail");
        let oldest = record.pending[0].run.output.as_ref().unwrap();
        assert!(oldest.stdout.len() <= SHORT_OUTPUT && oldest.stdout.len() < binary.len());
    }

    #[test]
    fn urls_are_checked_and_logged_without_their_secrets() {
        assert!(check_url("https://hooks.example.com/T000/B000/XXXX").is_ok());
        assert!(check_url("http://127.0.0.1:8080").is_ok());
        for bad in ["ftp://x", "https://", "http:///path", "https://a b", "example.com"] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
        assert_eq!(url_origin("https://hc-ping.com/5f0e-uuid?x=1"), "https://hc-ping.com");
        assert_eq!(url_origin("https://user:token@example.com/x"), "https://");
        assert_eq!(url_origin("https://user:pa/ss@example.com/x"), "https://");
        assert_eq!(url_origin("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
    }

    #[test]
    fn a_body_carries_the_dedupe_key_and_the_end_of_the_output() {
        let mut failed = run(9, Outcome::Exited, Some(3));
        failed.output = Some(crate::rules::record::RunOutput {
            stdout: "é".repeat(MAX_BODY_OUTPUT),
            ..Default::default()
        });
        let mut record = Record::default();
        account(&mut record, &failed, &[&notifier(&Event::DEFAULT)], "a", Utc::now());
        let pending = &record.pending[0];
        let body = Body::of("nightly", pending);
        assert!(body.stdout.len() <= MAX_BODY_OUTPUT && body.stdout.starts_with('é'));
        let json = serde_json::to_value(&body).unwrap();
        assert_eq!(json["dedupe_key"], "nightly/2027-01-15T08:00:09.000Z/failure");
        assert_eq!(json["event"], "failure");
        assert_eq!(json["exit"], 3);
    }

    #[test]
    fn secret_headers_over_plain_http_to_another_host_are_warned_of() {
        let notifier = |url: &str, value: HeaderValue| Notifier {
            name: "ops".into(),
            url: url.into(),
            headers: vec![("Authorization".into(), value)],
            on: BTreeSet::new(),
        };
        let env = || HeaderValue::Env("OPS_HOOK_TOKEN".into());
        let cases = [
            (notifier("http://hooks.internal:8080/x", env()), Some("hooks.internal")),
            (
                notifier("http://user@10.0.0.7/x", HeaderValue::File("/run/t".into())),
                Some("10.0.0.7"),
            ),
            (notifier("https://hooks.internal/x", env()), None),
            (notifier("http://127.0.0.1:9000/x", env()), None),
            (notifier("http://localhost/x", env()), None),
            (notifier("http://[::1]:9000/x", env()), None),
            (
                notifier("http://hooks.internal/x", HeaderValue::Text("ops".into())),
                None,
            ),
        ];
        for (notifier, host) in cases {
            assert_eq!(notifier.secrets_in_the_clear(), host, "{}", notifier.url);
            assert_eq!(notifier.warnings().len(), usize::from(host.is_some()));
        }
    }
}
