//! How a run becomes events: whether it is a transition worth telling, for which notifiers, and
//! how the record's undelivered events stay within their bounds.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::notifier::{Event, Notifier};
use super::record::{Pending, Record, MAX_BODY_OUTPUT, MAX_PENDING, MAX_RECORD_BYTES, SHORT_OUTPUT};
use crate::rules::record::{Outcome, RunRecord, Trigger};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::notify::Body;

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
}
