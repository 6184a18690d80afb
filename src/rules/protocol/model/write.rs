//! A term's writes in the model: worked out and checked live, sent to the abstract etcd, read
//! again when their outcome was not seen, and booked when they landed; and the last write of a
//! term that ends by choice.

use std::collections::{BTreeMap, BTreeSet};

use super::etcd::Election;
use super::node::{Phase, Step, Write};
use super::{at, second, Rules};
use crate::rules::protocol::takeover::{self, Known, Leader};
use crate::rules::protocol::{after_reread, guards, next_record, Owner, Reread, Want, Writer};
use crate::rules::record::Claim;

impl Step<'_> {
    pub(super) fn prepare(&mut self, n: usize, shard: u32) {
        let time = self.state.time;
        if !self.state.nodes[n].live(time) {
            return;
        }
        let live = self.state.etcd.live_families();
        let model = self.model;
        let node = &self.state.nodes[n];
        let Some(term) = node.terms.get(&shard) else { return };
        let mut write = match term.write.clone() {
            Some(write) => write,
            None => {
                let write = self.plan_write(n, shard, &live);
                if model.rules != Rules::LostAfterClaim {
                    // Recorded lost before the claim that drops them from the records.
                    for (job, (settled, _)) in &write.plans {
                        for (_, lost) in settled {
                            self.state.log.recorded.extend(lost.iter().map(|tick| (*job, *tick)));
                        }
                    }
                }
                write
            }
        };
        let Some(term) = self.state.nodes[n].terms.get_mut(&shard) else {
            return;
        };
        if term.write.is_none() {
            term.behind.clear();
        }
        // Starts not yet written ride along.
        for job in term.unrecorded.iter() {
            write.riding.insert(*job);
            if !write.wants.iter().any(|want| want.index == *job) {
                write.wants.push(Want::starts_only(*job));
            }
        }
        if write.wants.is_empty() {
            return;
        }
        let (writer_pool, writer_shards) = model.family(n, &self.state.nodes[n], shard);
        let node_name = n.to_string();
        let term = &self.state.nodes[n].terms[&shard];
        let mut intended = Vec::new();
        let mut expected = Vec::new();
        for want in &write.wants {
            let (revision, record) = term.book[&want.index].clone().unwrap_or_default();
            let job = &model.jobs[want.index];
            let writer = Writer {
                term: term.term,
                node: &node_name,
                shards: writer_shards,
                pool: writer_pool.as_deref(),
                releasing: write.releasing && (model.rules == Rules::ReleaseAdopted || term.owed.releasable(&job.name)),
            };
            let mut record = next_record(
                record.as_ref(),
                want,
                &term.owed.listed(&job.name),
                &writer,
                job.schedule.label(),
            );
            if model.rules == Rules::BeforeIssue27 {
                record = record.map(stamp_others_as_own);
            }
            intended.push(record);
            expected.push(revision);
        }
        write.phase = Phase::Ready(intended, expected);
        if let Some(term) = self.term(n, shard) {
            term.write = Some(write);
        }
    }

    /// A new write: the takeover of the jobs behind, or each job's next tick.
    fn plan_write(&self, n: usize, shard: u32, live: &BTreeSet<(Option<String>, u32)>) -> Write {
        let node = &self.state.nodes[n];
        let term = &node.terms[&shard];
        let node_name = n.to_string();
        let (pool, shards) = self.model.family(n, node, shard);
        let leader = Leader {
            term: term.term,
            node: &node_name,
            shards,
            pool: pool.as_deref(),
        };
        let now = at(node.now(self.state.time));
        let before_27 = self.model.rules == Rules::BeforeIssue27;
        let mut write = Write {
            wants: Vec::new(),
            phase: Phase::Planned,
            riding: BTreeSet::new(),
            plans: BTreeMap::new(),
            releasing: false,
        };
        if !term.behind.is_empty() {
            for job in &term.behind {
                let spec = &self.model.jobs[*job];
                let record = term.book[job].as_ref().and_then(|(_, record)| record.as_ref());
                let plan = takeover::plan(
                    &leader,
                    &Known {
                        index: *job,
                        job: spec,
                        record,
                        owed: term.owed.count(&spec.name),
                        started_here: &|tick| node.started_here.contains(&(*job, second(tick))),
                        gone: &|pool, count| {
                            // A node's own election is never gone to another node.
                            before_27
                                || (!pool.is_some_and(|pool| pool.starts_with('@'))
                                    && !live.contains(&(pool.map(str::to_string), count)))
                        },
                        took_over: now,
                        now,
                    },
                );
                let lost = plan
                    .settled
                    .into_iter()
                    .map(|settled| (settled.debt, settled.lost.into_iter().map(second).collect()))
                    .collect();
                let never_started = plan.never_started.into_iter().map(second).collect();
                write.plans.insert(*job, (lost, never_started));
                write.wants.extend(plan.want);
            }
            return write;
        }
        for job in term.book.keys() {
            if let Some(tick) = Self::next_tick(self.model, node, self.state.time, term, *job) {
                let mut want = Want::tick(*job, at(tick));
                want.fills_gap = self.model.rules != Rules::SkipGap;
                write.wants.push(want);
            }
        }
        write
    }

    pub(super) fn send(&mut self, n: usize, shard: u32, lost_reply: bool) {
        let model = self.model;
        let names: Vec<String> = model.jobs.iter().map(|job| job.name.clone()).collect();
        let node = &self.state.nodes[n];
        let election: Election = model.election(n, node, shard);
        let Some(term) = node.terms.get(&shard) else { return };
        let Some(write) = term.write.clone() else { return };
        let Phase::Ready(intended, expected) = write.phase.clone() else {
            return;
        };
        let guarded = guards(
            term.term,
            write
                .wants
                .iter()
                .zip(&expected)
                .map(|(want, revision)| (names[want.index].as_str(), *revision)),
        );
        let leader_guard = model.rules != Rules::Unguarded;
        if self.state.etcd.holds(election, &guarded, &names, leader_guard) {
            let puts: Vec<(usize, Claim)> = write
                .wants
                .iter()
                .zip(&intended)
                .filter_map(|(want, record)| record.clone().map(|record| (want.index, record)))
                .collect();
            let revision = self.state.etcd.commit(puts);
            for want in &write.wants {
                for tick in want.fresh.iter().chain(&want.adopt) {
                    self.state.log.claimed.insert((want.index, second(*tick)));
                }
            }
            if lost_reply {
                self.set_phase(n, shard, Phase::Unsettled(intended, expected));
                return;
            }
            for (want, record) in write.wants.iter().cloned().zip(intended) {
                self.won(n, shard, &write, want, record, revision, false);
            }
            if let Some(term) = self.term(n, shard) {
                term.write = None;
            }
            return;
        }
        let leads = self
            .state
            .etcd
            .candidates
            .get(&election)
            .is_some_and(|keys| keys.iter().any(|key| key.create_revision == term.term));
        if leads || lost_reply {
            self.set_phase(n, shard, Phase::Unsettled(intended, expected));
        } else {
            // Deposed: what it owes stays listed in etcd for its successor.
            self.state.nodes[n].terms.remove(&shard);
        }
    }

    fn set_phase(&mut self, n: usize, shard: u32, phase: Phase) {
        if let Some(write) = self.term(n, shard).and_then(|term| term.write.as_mut()) {
            write.phase = phase;
        }
    }

    pub(super) fn reread(&mut self, n: usize, shard: u32) {
        let Some(write) = self.term(n, shard).and_then(|term| term.write.clone()) else {
            return;
        };
        let Phase::Unsettled(intended, expected) = write.phase.clone() else {
            return;
        };
        let mut open = Vec::new();
        for ((want, intended), expected) in write.wants.iter().cloned().zip(intended).zip(expected) {
            let seen = self.state.etcd.seen(want.index);
            let job = want.index;
            let spec = &self.model.jobs[job];
            match after_reread(spec, want, &seen, expected, intended, write.riding.contains(&job)) {
                Reread::Won { want, record, earlier } => {
                    self.won(n, shard, &write, want, record, seen.mod_revision, earlier)
                }
                Reread::Open(want) => open.push(want),
                Reread::Changed { again, .. } => {
                    if let Some(term) = self.term(n, shard) {
                        term.book.insert(job, Some((seen.mod_revision, seen.claim.clone())));
                    }
                    let again = match (self.model.rules, again) {
                        (Rules::DropSettlesOnChange, Some(mut want)) if !want.starts_only => {
                            want.adopt.clear();
                            want.settles.clear();
                            Some(want)
                                .filter(|want| !want.fresh.is_empty())
                                .or_else(|| write.riding.contains(&job).then(|| Want::starts_only(job)))
                        }
                        (_, again) => again,
                    };
                    open.extend(again);
                }
            }
        }
        if let Some(term) = self.term(n, shard) {
            term.write = (!open.is_empty()).then_some(Write {
                wants: open,
                phase: Phase::Planned,
                ..write
            });
        }
    }

    /// Books a write that landed, as `Claimer::won` and the takeover's `deliver` do.
    #[allow(clippy::too_many_arguments)]
    fn won(
        &mut self,
        n: usize,
        shard: u32,
        write: &Write,
        want: Want,
        record: Option<Claim>,
        revision: i64,
        earlier: bool,
    ) {
        let job = want.index;
        let name = self.model.jobs[job].name.clone();
        let node = &mut self.state.nodes[n];
        if let Some(record) = &record {
            let listed: BTreeSet<i64> = record.listed().into_iter().map(second).collect();
            node.started_here
                .retain(|(started, tick)| *started != job || listed.contains(tick));
        }
        let Some(term) = node.terms.get_mut(&shard) else { return };
        term.book.insert(job, Some((revision, record)));
        term.owed
            .owe(&name, want.fresh.iter().chain(&want.adopt).copied(), revision);
        if !earlier && write.riding.contains(&job) {
            term.unrecorded.remove(&job);
        }
        if let Some((settled, never_started)) = write.plans.get(&job) {
            for tick in want
                .adopt
                .iter()
                .filter(|tick| !never_started.contains(&second(**tick)))
            {
                term.owed.redeliver(&name, *tick);
            }
            if self.model.rules == Rules::LostAfterClaim {
                for (debt, lost) in settled {
                    if want.settles.contains(&Owner::of(debt)) {
                        self.state.log.recorded.extend(lost.iter().map(|tick| (job, *tick)));
                    }
                }
            }
        }
    }

    /// The last write of a term that ends by choice: its starts, and what it still owes marked
    /// released. Dropped if its guards fail: the next leader delivers those ticks again.
    pub(super) fn last_write(&mut self, n: usize, shard: u32) {
        let model = self.model;
        let Some(term) = self.term(n, shard) else { return };
        let mut wants: Vec<Want> = Vec::new();
        let owing: BTreeSet<usize> = term
            .book
            .keys()
            .filter(|job| !term.owed.listed(&model.jobs[**job].name).is_empty())
            .chain(&term.unrecorded)
            .copied()
            .collect();
        if owing.iter().any(|job| term.book.get(job).is_none_or(Option::is_none)) {
            return;
        }
        wants.extend(owing.iter().map(|job| Want::starts_only(*job)));
        if wants.is_empty() {
            return;
        }
        term.write = Some(Write {
            wants,
            phase: Phase::Planned,
            riding: owing,
            plans: BTreeMap::new(),
            releasing: true,
        });
        let valid = self.state.nodes[n].live(self.state.time);
        if valid {
            self.prepare(n, shard);
            self.send(n, shard, false);
        }
    }
}

/// The record as a writer before #27 wrote it: every pending tick listed as its own.
fn stamp_others_as_own(mut claim: Claim) -> Claim {
    let mut pending: BTreeSet<_> = claim.pending.iter().copied().collect();
    pending.extend(claim.others.drain(..).flat_map(|debt| debt.pending));
    claim.pending = pending.into_iter().collect();
    claim
}
