//! Which steps the model's nodes may take next: time, each node's next step in its code's
//! order, its starts, and the faults still allowed.

use super::node::{Inner, Node, Phase, Step, Term, Write};
use super::{at, second, Action, Protocol, State};

impl Step<'_> {
    pub(crate) fn actions(model: &Protocol, state: &State, actions: &mut Vec<Action>) {
        let time = state.time;
        if time < model.end() {
            actions.push(Action::Tick);
        }
        let faults_left = state.faults < model.faults && time <= model.horizon;
        for (n, node) in state.nodes.iter().enumerate() {
            if !node.alive {
                if faults_left {
                    let configs: &[bool] = if model.rollout { &[true, false] } else { &[true] };
                    for count in &model.counts {
                        actions.extend(configs.iter().map(|pooled| Action::Restart(n, *count, *pooled)));
                    }
                }
                continue;
            }
            if node.stalled {
                continue;
            }
            let next = Self::next_step(model, state, n);
            if let Some(inner) = &next {
                actions.push(Action::Step(n, inner.clone()));
            }
            if model.concurrent_starts {
                for (shard, term) in &node.terms {
                    if let Some((job, tick)) = Self::due(model, node, time, term) {
                        actions.push(Action::Fire(n, *shard, job, tick));
                    }
                }
            }
            if faults_left {
                if let Some(Inner::Send(shard)) = next {
                    actions.push(Action::LoseReply(n, shard));
                }
                actions.push(Action::Crash(n));
                if node.live(time) {
                    actions.push(Action::Stall(n));
                    if node.terms.values().all(|term| term.write.is_none()) {
                        actions.push(Action::Stop(n));
                        actions.extend(node.terms.keys().map(|shard| Action::Resign(n, *shard)));
                    }
                }
            }
        }
    }

    /// The node's next step, if it has one.
    fn next_step(model: &Protocol, state: &State, n: usize) -> Option<Inner> {
        let node = &state.nodes[n];
        let time = state.time;
        // A write checked before a stall is sent after it, whatever the lease.
        for (shard, term) in &node.terms {
            if let Some(Write {
                phase: Phase::Ready(..),
                ..
            }) = term.write
            {
                return Some(Inner::Send(*shard));
            }
        }
        let Some(lease) = node.lease else {
            return Some(Inner::Join);
        };
        if !state.etcd.leases.contains_key(&lease) || time >= node.valid_until {
            return Some(Inner::SessionLost);
        }
        for shard in model.slots(n, node) {
            let election = model.election(n, node, shard);
            let Some(term) = node.terms.get(&shard) else {
                let own = state.etcd.candidate(election, lease);
                if own.is_some() && state.etcd.leader(election) == own {
                    return Some(Inner::Lead(shard));
                }
                continue;
            };
            let step = match &term.write {
                Some(Write {
                    phase: Phase::Unsettled(..),
                    ..
                }) => Some(Inner::Reread(shard)),
                Some(_) => Some(Inner::Prepare(shard)),
                None if term.counts_seen != state.etcd.live_families() => Some(Inner::FleetChange(shard)),
                None if term.book.values().any(Option::is_none) => Some(Inner::Read(shard)),
                None if !model.concurrent_starts && Self::due(model, node, time, term).is_some() => {
                    Self::due(model, node, time, term).map(|(job, tick)| Inner::Fire(shard, job, tick))
                }
                None if Self::has_write(model, node, time, term) => Some(Inner::Prepare(shard)),
                None => None,
            };
            if step.is_some() {
                return step;
            }
        }
        None
    }

    /// The earliest tick a term owes that is due by the node's clock, if its lease holds.
    pub(super) fn due(model: &Protocol, node: &Node, time: u8, term: &Term) -> Option<(usize, i64)> {
        if !node.live(time) {
            return None;
        }
        let now = node.now(time);
        term.book
            .keys()
            .filter_map(|job| {
                let name = &model.jobs[*job].name;
                (0..=now)
                    .find(|tick| term.owed.fence(name, at(*tick)).is_some())
                    .map(|tick| (*job, tick))
            })
            .min_by_key(|(_, tick)| *tick)
    }

    /// Whether a term has anything to write: takeovers, new ticks, or starts.
    fn has_write(model: &Protocol, node: &Node, time: u8, term: &Term) -> bool {
        !term.behind.is_empty()
            || !term.unrecorded.is_empty()
            || term
                .book
                .keys()
                .any(|job| Self::next_tick(model, node, time, term, *job).is_some())
    }

    /// The next tick of `job` a term claims now: the one after the last claimed, once the
    /// node's clock is within a second of it, up to the horizon.
    pub(super) fn next_tick(model: &Protocol, node: &Node, time: u8, term: &Term, job: usize) -> Option<i64> {
        let now = node.now(time);
        let last = term
            .book
            .get(&job)?
            .as_ref()?
            .1
            .as_ref()
            .map(|claim| second(claim.scheduled_at));
        let next = last.map_or(now + 1, |last| last + 1);
        let name = &model.jobs[job].name;
        (next <= now + 1 && next <= i64::from(model.horizon) && term.owed.fence(name, at(next)).is_none())
            .then_some(next)
    }
}
