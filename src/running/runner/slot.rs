//! A slot of the job's concurrency group for one attempt: taken before it starts, waited for in
//! the group's line at most as long as the tick may wait.

use std::future::Future;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::{Stops, Tick};
use crate::clock;
use crate::coord::groups::{self, GaveUp, Groups, Slot};
use crate::rules::bounds::MAX_WAIT;
use crate::rules::groups::{Group, Place};

/// Why an attempt got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSlot {
    /// The group stayed full until the tick could wait no longer.
    Full,
    /// The leadership that claimed the tick ended, or the node's commands are being killed.
    NotLeading,
    /// A newer tick replaces this one (`overlap = "replace"`).
    Replaced,
    /// Whatever else the caller gives up for (a pause).
    Other,
}

/// Until when a tick waits for a slot of `group`, from `now`: the group's `wait`, else until
/// the job's next tick; never past the job's `starting_deadline`.
pub fn wait_until(tick: &Tick, group: &Group, now: DateTime<Utc>) -> DateTime<Utc> {
    let longest = now + MAX_WAIT;
    let due = tick.due_at(now);
    let by_wait = match group.wait {
        Some(wait) => now + wait,
        None => tick.job.schedule.next_after(due.max(now)).unwrap_or(longest),
    };
    let by_deadline = tick.job.starting_deadline.map_or(longest, |deadline| due + deadline);
    by_wait.min(by_deadline).min(longest)
}

/// Takes a slot of `group` for an attempt of `tick`, or says why none was taken. `other` ends
/// the wait for a reason of the caller's.
pub async fn take(
    tick: &Tick,
    group: &Group,
    groups: &Arc<Groups>,
    stops: &Stops<'_>,
    other: impl Future<Output = ()>,
) -> Result<Slot, NoSlot> {
    let now = clock::now();
    let until = wait_until(tick, group, now);
    let give_up = async {
        tokio::select! {
            _ = clock::sleep_past(until) => NoSlot::Full,
            _ = tick.starts.leading().cancelled() => NoSlot::NotLeading,
            _ = stops.kill.cancelled() => NoSlot::NotLeading,
            _ = stops.replace.cancelled() => NoSlot::Replaced,
            _ = other => NoSlot::Other,
        }
    };
    let place = Place {
        due: tick.due_at(now),
        job: tick.job.name.clone(),
        fence: tick.fence,
    };
    let holder = groups::holder(&tick.node, &tick.job.name, tick.scheduled_at, tick.fence);
    groups
        .acquire(group, holder, place, give_up)
        .await
        .map_err(|GaveUp(why)| why)
}
