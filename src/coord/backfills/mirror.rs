//! The backfills every node mirrors, and the ticks this node claimed and holds.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use super::record::BACKFILL;
use crate::coord::etcd::CoordError;
use crate::coord::keys::Keys;
use crate::coord::mirror::{Mirror, Put};
use crate::coord::record_at_key::decode;
use crate::rules::backfill::{Backfill, InFlight};

/// The backfills every node sees, kept current by a watch while the node has a session, and
/// the backfill ticks this node claimed and has not counted yet.
#[derive(Debug)]
pub(crate) struct Backfills {
    records: Mutex<HashMap<String, Backfill>>,
    /// By job and tick, the claim this node holds.
    held: Mutex<HashMap<(String, DateTime<Utc>), String>>,
    changed: watch::Sender<u64>,
}

impl Default for Backfills {
    fn default() -> Backfills {
        Backfills {
            records: Mutex::default(),
            held: Mutex::default(),
            changed: watch::channel(0).0,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Backfills {
    /// Changes when a backfill record does; marked changed at once, for those already there.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        let mut receiver = self.changed.subscribe();
        receiver.mark_changed();
        receiver
    }

    /// The jobs `wanted` picks whose backfill has a tick to claim or one in flight.
    pub(crate) fn with_work(&self, wanted: impl Fn(&str) -> bool) -> Vec<String> {
        let mut jobs: Vec<String> = lock(&self.records)
            .iter()
            .filter(|(job, backfill)| wanted(job) && !backfill.is_over())
            .map(|(job, _)| job.clone())
            .collect();
        jobs.sort();
        jobs
    }

    /// The ticks of `job`'s backfill in flight on nodes other than `node`, as last seen.
    pub(crate) fn in_flight_elsewhere(&self, job: &str, node: &str) -> Vec<InFlight> {
        lock(&self.records).get(job).map_or_else(Vec::new, |backfill| {
            backfill
                .in_flight
                .iter()
                .filter(|flight| flight.node != node)
                .cloned()
                .collect()
        })
    }

    /// The jobs whose backfill lists a tick in flight on `node` that this node does not hold.
    pub(crate) fn unheld_on(&self, node: &str) -> Vec<String> {
        let held = lock(&self.held);
        lock(&self.records)
            .iter()
            .filter(|(job, backfill)| {
                backfill.in_flight.iter().any(|flight| {
                    flight.node == node && held.get(&((*job).clone(), flight.tick)) != Some(&flight.claim)
                })
            })
            .map(|(job, _)| job.clone())
            .collect()
    }

    /// Marks claim `claim` of a tick this node is about to make: held until
    /// [`Backfills::release`] of that claim.
    pub(crate) fn hold(&self, job: &str, tick: DateTime<Utc>, claim: &str) {
        lock(&self.held).insert((job.to_string(), tick), claim.to_string());
    }

    /// Ends the hold of `claim`, unless a later claim of the tick holds it now.
    pub(crate) fn release(&self, job: &str, tick: DateTime<Utc>, claim: &str) {
        let mut held = lock(&self.held);
        let key = (job.to_string(), tick);
        if held.get(&key).is_some_and(|holding| holding == claim) {
            held.remove(&key);
        }
    }

    /// Whether this node holds `flight`'s claim.
    pub(crate) fn holds(&self, job: &str, flight: &InFlight) -> bool {
        lock(&self.held).get(&(job.to_string(), flight.tick)) == Some(&flight.claim)
    }
}

impl Mirror for Backfills {
    const WHAT: &'static str = "backfills";

    fn prefix(keys: &Keys) -> String {
        keys.backfills_prefix()
    }

    fn clear(&self) {
        lock(&self.records).clear();
    }

    fn apply(&self, keys: &Keys, key: &[u8], put: Option<Put>) {
        let prefix = keys.backfills_prefix();
        let Some(job) = std::str::from_utf8(key)
            .ok()
            .and_then(|key| key.strip_prefix(prefix.as_str()))
        else {
            return;
        };
        match put.map(|put| decode::<Backfill>(BACKFILL, put.value).map_err(CoordError::from)) {
            Some(Ok(backfill)) => {
                lock(&self.records).insert(job.to_string(), backfill);
            }
            Some(Err(err)) => {
                tracing::warn!(job, error = %err, "unreadable backfill record; ignoring it");
                lock(&self.records).remove(job);
            }
            None => {
                lock(&self.records).remove(job);
            }
        }
        self.changed.send_modify(|count| *count += 1);
    }
}
