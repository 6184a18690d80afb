//! What the checker proves in every state it reaches, in the words of
//! `docs/how-it-works.md#what-the-model-checker-proves`.

use stateright::Property;

use super::{Log, Protocol, Start, State};
use crate::rules::config::Delivery;

pub(crate) const AT_MOST_ONCE: &str = "no tick of an at-most-once job starts twice";
pub(crate) const FENCES_GROW: &str =
    "every start carries a fence at least that of every earlier start of its job by a leader of the same shard count";
pub(crate) const REPEATS_FLAGGED: &str =
    "a repeat of an at-least-once tick carries CRON_REDELIVERED and a higher fence";
pub(crate) const NO_SILENT_LOSS: &str =
    "no claimed tick leaves the records without having started or been recorded lost";
pub(crate) const DELIVERED: &str =
    "while some node that may run it lives, every due tick of an at-least-once job is started or recorded";
/// A tick recorded lost may have started on the leader that died owing it (that is why an
/// at-most-once successor records it rather than runs it); it never starts after.
pub(crate) const LOST_NEVER_STARTS: &str = "no tick starts after it was recorded lost";
pub(crate) const PLACED: &str =
    "a tick starts only where its config lets it run: a pool's job on a node with the pool's tags, a node's instance of a fanned-out job on that node";

pub(crate) fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(AT_MOST_ONCE, at_most_once),
        Property::always(FENCES_GROW, fences_grow),
        Property::always(REPEATS_FLAGGED, repeats_flagged),
        Property::always(NO_SILENT_LOSS, no_silent_loss),
        Property::eventually(DELIVERED, delivered),
        Property::always(PLACED, placed),
        Property::always(LOST_NEVER_STARTS, lost_never_starts),
    ]
}

/// Logs `start`, with the properties it breaks.
pub(crate) fn on_start(model: &Protocol, log: &mut Log, start: Start) {
    if !start.placed {
        log.broken.insert(PLACED);
    }
    if log.recorded.contains(&(start.job, start.tick)) {
        log.broken.insert(LOST_NEVER_STARTS);
    }
    let earlier = log.started.get(&(start.job, start.tick)).copied();
    if let Some((_, fence)) = earlier {
        if model.jobs[start.job].delivery == Delivery::AtMostOnce {
            log.broken.insert(AT_MOST_ONCE);
        }
        if !start.redelivered || start.fence <= fence {
            log.broken.insert(REPEATS_FLAGGED);
        }
    }
    let highest = log.highest.entry((start.job, start.shards)).or_insert(start.fence);
    if start.fence < *highest {
        log.broken.insert(FENCES_GROW);
    }
    *highest = start.fence.max(*highest);
    let count = earlier.map_or(0, |(count, _)| count);
    log.started
        .insert((start.job, start.tick), (count.saturating_add(1), start.fence));
}

fn at_most_once(_: &Protocol, state: &State) -> bool {
    !state.log.broken.contains(AT_MOST_ONCE)
}

fn fences_grow(_: &Protocol, state: &State) -> bool {
    !state.log.broken.contains(FENCES_GROW)
}

fn repeats_flagged(_: &Protocol, state: &State) -> bool {
    !state.log.broken.contains(REPEATS_FLAGGED)
}

fn lost_never_starts(_: &Protocol, state: &State) -> bool {
    !state.log.broken.contains(LOST_NEVER_STARTS)
}

fn placed(_: &Protocol, state: &State) -> bool {
    !state.log.broken.contains(PLACED)
}

fn no_silent_loss(_: &Protocol, state: &State) -> bool {
    state.log.claimed.iter().all(|(job, tick)| {
        state.log.started.contains_key(&(*job, *tick))
            || state.log.recorded.contains(&(*job, *tick))
            || state
                .etcd
                .records
                .get(job)
                .is_some_and(|(_, claim)| claim.listed().iter().any(|listed| super::second(*listed) == *tick))
    })
}

/// Holds once time has run past every dead node's lease, with every tick up to the horizon
/// started or recorded, for each job some live node may run: a pool's job waits for a node
/// with the pool's tags, a node's instance for that node.
fn delivered(model: &Protocol, state: &State) -> bool {
    if state.time < model.end() {
        return false;
    }
    let served = |job: usize| {
        state.nodes.iter().enumerate().any(|(n, node)| {
            node.alive
                && model
                    .slots(n, node)
                    .into_iter()
                    .any(|slot| model.jobs_in(n, node, slot).contains(&job))
        })
    };
    model
        .jobs
        .iter()
        .enumerate()
        .filter(|(job, _)| served(*job))
        .all(|(job, spec)| {
            let Some(first) = state
                .log
                .claimed
                .iter()
                .filter(|(claimed, _)| *claimed == job)
                .map(|(_, tick)| *tick)
                .min()
            else {
                return true;
            };
            spec.delivery != Delivery::AtLeastOnce
                || (first..=i64::from(model.horizon)).all(|tick| {
                    state.log.started.contains_key(&(job, tick)) || state.log.recorded.contains(&(job, tick))
                })
        })
}
