//! Pauses: an operator stops a job's ticks (or every job's) from the command line, and every
//! node sees it from its next tick, without a reload.
//!
//! `/shardcron/<cluster>/pauses/<job>` (`/pauses/*` for every job) holds a [`Pause`]. A paused
//! tick is still claimed, with its fence, and recorded with the outcome `paused` instead of run:
//! its claim moves the job's record past it, so no later leader catches it up. `resume` closes
//! the pause (its `until` becomes the resume time) rather than deleting it, so a leader that
//! takes over after the resume, and finds ticks that passed while the shard had no leader,
//! still knows those inside the pause were paused, not missed. A pause key outlives the job's
//! removal from `jobs.toml`: a job added back keeps its pause.

use std::collections::HashMap;
use std::sync::RwLock;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::coord::mirror::{self, Mirror};

/// The key name of a pause of every job (`pause --all`); no job name can be `*`.
pub const EVERY_JOB: &str = "*";

/// The value of `/pauses/<job>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// When the pause was asked for.
    pub since: DateTime<Utc>,
    /// When it ends by itself (`--until`, `--for`, or the time of `resume`); `None`: until resumed.
    #[serde(default)]
    pub until: Option<DateTime<Utc>>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// The longest pause reason, in bytes: it is shown by `status` and logged by every node.
pub const MAX_REASON: usize = 1024;

impl Pause {
    /// The pause an operator asks for at `now`: until an instant, for a length, or until
    /// resumed. Refused when it would end before it starts, or its reason is longer than
    /// [`MAX_REASON`].
    pub fn asked(
        now: DateTime<Utc>,
        until: Option<DateTime<Utc>>,
        length: Option<std::time::Duration>,
        reason: Option<String>,
    ) -> Result<Pause, PauseRefused> {
        if reason.as_ref().is_some_and(|reason| reason.len() > MAX_REASON) {
            return Err(PauseRefused::ReasonTooLong);
        }
        let until = match (until, length) {
            (Some(until), _) => Some(until),
            (None, Some(length)) => Some(
                chrono::Duration::from_std(length)
                    .ok()
                    .and_then(|length| now.checked_add_signed(length))
                    .ok_or(PauseRefused::TooLong)?,
            ),
            (None, None) => None,
        };
        if until.is_some_and(|until| until <= now) {
            return Err(PauseRefused::EndsBeforeItStarts);
        }
        Ok(Pause {
            since: now,
            until,
            reason,
        })
    }

    /// Whether the pause holds at `now`.
    pub fn in_force(&self, now: DateTime<Utc>) -> bool {
        self.until.is_none_or(|until| now < until)
    }

    /// Whether a tick is not to run: the pause holds now, or the tick was due while it held.
    pub fn stops(&self, scheduled_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        self.in_force(now) || (self.since <= scheduled_at && self.in_force(scheduled_at))
    }
}

/// Why a pause asked for cannot be stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PauseRefused {
    #[error("the pause would end before it starts: `until` must be in the future")]
    EndsBeforeItStarts,
    #[error("the pause is too long")]
    TooLong,
    #[error("the reason is longer than {MAX_REASON} bytes")]
    ReasonTooLong,
}

/// The pauses a node knows of, kept current by a watch for as long as it has a session.
#[derive(Debug, Default)]
pub(crate) struct Pauses {
    by_job: RwLock<HashMap<String, Pause>>,
}

impl Pauses {
    /// The pause that keeps `job`'s tick at `scheduled_at` from running at `now`, if one does.
    pub(crate) fn stopping(&self, job: &str, scheduled_at: DateTime<Utc>, now: DateTime<Utc>) -> Option<Pause> {
        let by_job = self.by_job.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        [job, EVERY_JOB]
            .iter()
            .filter_map(|name| by_job.get(*name))
            .find(|pause| pause.stops(scheduled_at, now))
            .cloned()
    }
}

impl Pauses {
    /// How many pauses hold at `now`.
    pub(crate) fn in_force(&self, now: DateTime<Utc>) -> usize {
        let by_job = self.by_job.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        by_job.values().filter(|pause| pause.in_force(now)).count()
    }
}

impl Mirror for Pauses {
    const WHAT: &'static str = "pauses";

    fn prefix(keys: &Keys) -> String {
        keys.pauses_prefix()
    }

    fn clear(&self) {
        self.by_job
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clear();
    }

    fn apply(&self, keys: &Keys, key: &[u8], put: Option<crate::coord::mirror::Put>) {
        let Some(job) = std::str::from_utf8(key).ok().and_then(|key| keys.parse_pause(key)) else {
            return;
        };
        let mut by_job = self.by_job.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        match put.map(|put| serde_json::from_slice::<Pause>(put.value)) {
            Some(Ok(pause)) => {
                tracing::info!(
                    job,
                    until = %crate::clock::shown(pause.until),
                    reason = pause.reason.as_deref().unwrap_or("-"),
                    "pause changed"
                );
                by_job.insert(job.to_string(), pause);
            }
            Some(Err(err)) => tracing::warn!(job, error = %err, "unreadable pause record; ignoring it"),
            None => {
                by_job.remove(job);
            }
        }
    }
}

/// Pauses `jobs` (or every job, as [`EVERY_JOB`]) with one transaction.
pub async fn pause(
    client: &etcd_client::Client,
    keys: &Keys,
    jobs: &[String],
    pause: &Pause,
) -> Result<(), CoordError> {
    let value = serde_json::to_vec(pause).map_err(|err| CoordError::Protocol(err.to_string()))?;
    let puts: Vec<etcd_client::TxnOp> = jobs
        .iter()
        .map(|job| etcd_client::TxnOp::put(keys.pause(job), value.clone(), None))
        .collect();
    etcd::call(client.clone().txn(etcd_client::Txn::new().and_then(puts))).await?;
    Ok(())
}

/// Ends the pauses of `jobs` (every pause when `jobs` is `None`) at `now`; returns the jobs
/// whose pause was in force.
pub async fn resume(
    client: &etcd_client::Client,
    keys: &Keys,
    jobs: Option<&[String]>,
    now: DateTime<Utc>,
) -> Result<Vec<String>, CoordError> {
    let (read, _) = etcd::read_prefix(client, &keys.pauses_prefix()).await?;
    let mut ended = Vec::new();
    let mut puts = Vec::new();
    for kv in &read {
        let Some(job) = std::str::from_utf8(kv.key()).ok().and_then(|key| keys.parse_pause(key)) else {
            continue;
        };
        if jobs.is_some_and(|jobs| !jobs.iter().any(|wanted| wanted == job)) {
            continue;
        }
        let Ok(mut pause) = serde_json::from_slice::<Pause>(kv.value()) else {
            continue;
        };
        if !pause.in_force(now) {
            continue;
        }
        pause.until = Some(now);
        let value = serde_json::to_vec(&pause).map_err(|err| CoordError::Protocol(err.to_string()))?;
        // Only if nobody changed the pause since it was read: a newer pause is not ended unseen.
        puts.push((kv.key().to_vec(), kv.mod_revision(), value));
        ended.push(job.to_string());
    }
    for (key, revision, value) in puts {
        let txn = etcd_client::Txn::new()
            .when([etcd_client::Compare::mod_revision(
                key.clone(),
                etcd_client::CompareOp::Equal,
                revision,
            )])
            .and_then([etcd_client::TxnOp::put(key, value, None)]);
        etcd::call(client.clone().txn(txn)).await?;
    }
    Ok(ended)
}

/// Every pause in force at `now`, by job name ([`EVERY_JOB`] for `pause --all`).
pub async fn in_force(
    client: &etcd_client::Client,
    keys: &Keys,
    now: DateTime<Utc>,
) -> Result<HashMap<String, Pause>, CoordError> {
    let pauses = Pauses::default();
    mirror::load(client, keys, &pauses).await?;
    let mut by_job = pauses
        .by_job
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    by_job.retain(|_, pause| pause.in_force(now));
    Ok(by_job)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn a_pause_stops_ticks_while_it_holds_and_those_due_inside_it() {
        let open = Pause {
            since: at(100),
            until: None,
            reason: None,
        };
        // In force: every tick stops, even one due before the pause (a backlog started late).
        assert!(open.stops(at(50), at(150)));
        assert!(open.stops(at(150), at(150)));
        let resumed = Pause {
            until: Some(at(200)),
            ..open.clone()
        };
        // Resumed at 200: ticks due inside [100, 200) stay stopped when caught up later...
        assert!(resumed.stops(at(100), at(300)));
        assert!(resumed.stops(at(199), at(300)));
        // ...and the others run.
        assert!(!resumed.stops(at(99), at(300)));
        assert!(!resumed.stops(at(200), at(300)));
        assert!(!resumed.in_force(at(200)));
    }

    #[test]
    fn a_pause_is_refused_when_it_ends_first_or_its_reason_is_too_long() {
        let reason = |bytes: usize| Some("r".repeat(bytes));
        assert!(Pause::asked(at(0), None, None, reason(MAX_REASON)).is_ok());
        assert!(matches!(
            Pause::asked(at(0), None, None, reason(MAX_REASON + 1)),
            Err(PauseRefused::ReasonTooLong)
        ));
        assert!(matches!(
            Pause::asked(at(10), Some(at(5)), None, None),
            Err(PauseRefused::EndsBeforeItStarts)
        ));
    }

    #[test]
    fn a_pause_of_every_job_stops_each_job() {
        let keys = Keys::new("c");
        let pauses = Pauses::default();
        let pause = Pause {
            since: at(0),
            until: None,
            reason: Some("maintenance".into()),
        };
        let value = serde_json::to_vec(&pause).unwrap();
        let put = crate::coord::mirror::Put {
            value: &value,
            lease: 0,
        };
        pauses.apply(&keys, keys.pause(EVERY_JOB).as_bytes(), Some(put));
        assert_eq!(pauses.stopping("any", at(10), at(10)), Some(pause));
        pauses.apply(&keys, keys.pause(EVERY_JOB).as_bytes(), None);
        assert_eq!(pauses.stopping("any", at(10), at(10)), None);
    }
}
