//! What a receiver is sent: the JSON body of one event, and how long a send may take.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::notifier::Event;
use super::record::Pending;
use crate::rules::record::{Outcome, Trigger};

/// How long one delivery attempt (or one success ping) may take.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

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
