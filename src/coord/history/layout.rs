//! Where a run lives in its job's history.
//!
//! Under `runs/<job>/`:
//!
//! - `<tick>` (12 digits, seconds) a scheduled run, `<tick>.<ms>-manual` one asked for by hand:
//!   the live history, trimmed to the job's last `history` ticks.
//! - `+backfill/<tick>`: backfill runs, trimmed on their own to the last `history` ticks of the
//!   schedule up to the newest backfill tick written. They sort before every live key (`+`
//!   before `-` and the digits), outside the live trim's range `[-, horizon)`: a backfill of
//!   last year's ticks is not deleted by the next live run. (The previous release wrote them as
//!   `<tick>-backfill` among the live keys; those are still read.)
//! - `<entry key>/output`: the run's kept output tails (up to 2 x 64 KiB, 6 x that JSON-escaped),
//!   apart from its entry, so that a history listing reads entries of a few hundred bytes and
//!   pulls output only when asked. An entry written by the previous release holds its output
//!   inside; readers take both shapes.
//!
//! Why this layout keeps a rolling upgrade and a rollback safe: the output key sorts right
//! after its entry, inside the range every release's live trim deletes, so a node of the
//! previous release trims new outputs with their entries (no orphans after a rollback). That
//! release reads new entries without their output ("no output kept") and skips the output keys
//! it cannot parse as runs (a listing of N may then show fewer); it never reads `+backfill/`
//! before its N live keys, and its trim deletes `+backfill/` entries as it did its own backfill
//! entries. A separate prefix for outputs would have left them behind after a rollback.

use chrono::{DateTime, Utc};

use crate::coord::keys::Keys;
use crate::rules::record::{RunRecord, Trigger};

/// What follows an entry's key to name its output's.
pub(super) const OUTPUT_SUFFIX: &str = "/output";
/// The folder of a job's backfill runs, within its history's prefix.
pub(super) const BACKFILL_DIR: &str = "+backfill/";
/// Where a job's live keys start: `-` (a tick before 1970) and the digits sort from here,
/// [`BACKFILL_DIR`] before it.
pub(super) const LIVE_FROM: &str = "-";

/// The key of a run in its job's history: ticks sort by time, and a manual run or a backfill
/// after the schedule's tick of the same second.
pub(super) fn key(keys: &Keys, job: &str, record: &RunRecord) -> String {
    key_of(keys, job, record.scheduled_at, record.trigger)
}

/// The key of `job`'s history entry of the run of `at` (its tick, or when it was asked for).
pub(crate) fn key_of(keys: &Keys, job: &str, at: DateTime<Utc>, trigger: Trigger) -> String {
    match trigger {
        Trigger::Schedule => format!("{}{:012}", keys.job_runs_prefix(job), at.timestamp()),
        Trigger::Manual => format!(
            "{}{:012}.{:03}-manual",
            keys.job_runs_prefix(job),
            at.timestamp(),
            at.timestamp_subsec_millis()
        ),
        Trigger::Backfill => format!("{}{BACKFILL_DIR}{:012}", keys.job_runs_prefix(job), at.timestamp()),
    }
}

/// Where the previous release kept a backfill run: among the live keys, which trimmed it.
pub(super) fn legacy_backfill_key(keys: &Keys, job: &str, at: DateTime<Utc>) -> String {
    format!("{}{:012}-backfill", keys.job_runs_prefix(job), at.timestamp())
}

pub(super) fn output_key(entry_key: &str) -> String {
    format!("{entry_key}{OUTPUT_SUFFIX}")
}

/// Whether a history entry written by this release keeps its output under its own key: when
/// there is some. An empty one stays inside (a few bytes), so "printed nothing" still reads
/// apart from "no output kept".
pub(super) fn output_apart(record: &RunRecord) -> bool {
    record
        .output
        .as_ref()
        .is_some_and(|output| !output.stdout.is_empty() || !output.stderr.is_empty())
}
