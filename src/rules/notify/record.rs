//! What etcd keeps of a job's notifications (`/notify/<job>`): the undelivered events, the last
//! delivery, and the bounds that keep the record under etcd's request limit.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::notifier::Event;
use crate::rules::record::{RunRecord, Trigger};

/// An event not delivered this long after it happened is given up on: logged and counted.
pub const DELIVERY_PATIENCE: Duration = Duration::from_secs(10 * 60);
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
