//! A node of the model: its session, its terms, and the steps it takes, each a call of the
//! protocol's functions carried out against the abstract etcd.

use std::collections::{BTreeMap, BTreeSet};

use super::etcd::Election;
use super::{at, second, Action, Protocol, Rules, Start, State};
use crate::rules::protocol::takeover::{self, Known, Leader};
use crate::rules::protocol::{after_reread, counts_gone, guards, next_record, Owed, Owner, Reread, Want, Writer};
use crate::rules::record::{Claim, Debt};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Node {
    pub(crate) alive: bool,
    pub(crate) shards: u32,
    /// Its config puts the jobs with `run_on` in the pool; without, in the fleet's shards.
    pub(crate) pooled: bool,
    /// How far its wall clock is ahead of true time.
    pub(crate) skew: i8,
    pub(crate) lease: Option<u8>,
    /// The true second from which its lease may have expired, by its own monotonic reckoning
    /// from when it last asked for a renewal.
    pub(crate) valid_until: u8,
    pub(crate) terms: BTreeMap<u32, Term>,
    /// It does nothing, and does not renew its lease, until the lease has expired.
    pub(crate) stalled: bool,
    /// Ticks it started (job, second) that a record may still list: `StartedHere`.
    pub(crate) started_here: BTreeSet<(usize, i64)>,
}

impl Node {
    pub(crate) fn new(shards: u32, skew: i8) -> Node {
        Node {
            alive: true,
            shards,
            pooled: true,
            skew,
            lease: None,
            valid_until: 0,
            terms: BTreeMap::new(),
            stalled: false,
            started_here: BTreeSet::new(),
        }
    }

    /// Its wall clock, in model seconds.
    fn now(&self, time: u8) -> i64 {
        i64::from(time) + i64::from(self.skew)
    }

    fn live(&self, time: u8) -> bool {
        self.alive && self.lease.is_some() && time < self.valid_until
    }
}

/// One leadership of one shard.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Term {
    pub(crate) term: i64,
    /// Per job of the shard: the record's revision and the record, once read.
    pub(crate) book: BTreeMap<usize, Option<(i64, Option<Claim>)>>,
    pub(crate) owed: Owed,
    /// Jobs whose starts are not written yet.
    pub(crate) unrecorded: BTreeSet<usize>,
    /// Jobs whose earlier leaders' ticks are not settled yet.
    pub(crate) behind: BTreeSet<usize>,
    /// The election families the fleet ran when the term last looked.
    pub(crate) counts_seen: BTreeSet<(Option<String>, u32)>,
    pub(crate) write: Option<Write>,
}

/// What a takeover settles for one job: each debt with the ticks it records lost, and the
/// adopted ticks that never started.
pub(crate) type Settling = (Vec<(Debt, Vec<i64>)>, BTreeSet<i64>);

/// A write of a term, from its preparation until it settles.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Write {
    pub(crate) wants: Vec<Want>,
    pub(crate) phase: Phase,
    /// Jobs whose starts ride along.
    pub(crate) riding: BTreeSet<usize>,
    /// Per job of a takeover: the debts it settles with the ticks it records lost, and the
    /// adopted ticks that never started.
    pub(crate) plans: BTreeMap<usize, Settling>,
    pub(crate) releasing: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Phase {
    /// To be worked out (again) over the book: its records and guards.
    Planned,
    /// Checked live and ready to send: the record each want writes, and the revision it found.
    Ready(Vec<Option<Claim>>, Vec<i64>),
    /// Sent, its outcome unknown (rejected while leading, or the reply lost).
    Unsettled(Vec<Option<Claim>>, Vec<i64>),
}

/// One step applied to a state.
pub(crate) struct Step<'a> {
    pub(crate) model: &'a Protocol,
    pub(crate) state: &'a mut State,
}

/// A node's own steps, in the order its code takes them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Inner {
    /// It finds its lease gone in etcd or by its own clock.
    SessionLost,
    /// It gets a lease and enters the election of each of its shards.
    Join,
    /// It finds it leads a shard, and reads its records: a new term.
    Lead(u32),
    /// The term sends its write.
    Send(u32),
    /// The term reads the records again after a write it did not see settle.
    Reread(u32),
    /// The term sees the fleet's shard counts change.
    FleetChange(u32),
    /// The term reads the records it has not read (again) yet.
    Read(u32),
    /// The term starts a tick it owes that is due by the node's clock: (shard, job, tick).
    Fire(u32, usize, i64),
    /// The term works out its next write and checks its lease by its own clock.
    Prepare(u32),
}

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
    fn due(model: &Protocol, node: &Node, time: u8, term: &Term) -> Option<(usize, i64)> {
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
    fn next_tick(model: &Protocol, node: &Node, time: u8, term: &Term, job: usize) -> Option<i64> {
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

    pub(crate) fn apply(&mut self, action: Action) {
        let time = self.state.time;
        match action {
            Action::Tick => {
                self.state.time += 1;
                let now = self.state.time;
                let expires = now + self.model.ttl;
                for node in &mut self.state.nodes {
                    if node.stalled && now >= node.valid_until {
                        node.stalled = false;
                    }
                    if !node.alive || node.stalled || now >= node.valid_until {
                        continue;
                    }
                    if let Some(lease) = node.lease.and_then(|lease| self.state.etcd.leases.get_mut(&lease)) {
                        lease.expires = expires;
                        node.valid_until = expires;
                    }
                }
                self.state.etcd.expire(now);
            }
            Action::Step(n, inner) => self.step(n, inner, time),
            Action::Fire(n, shard, job, tick) => self.fire(n, shard, job, tick),
            Action::LoseReply(n, shard) => {
                self.state.faults += 1;
                self.send(n, shard, true);
            }
            Action::Stall(n) => {
                self.state.faults += 1;
                self.state.nodes[n].stalled = true;
            }
            Action::Resign(n, shard) => {
                self.state.faults += 1;
                self.last_write(n, shard);
                let node = &mut self.state.nodes[n];
                node.terms.remove(&shard);
                let election = self.model.election(n, node, shard);
                if let Some(lease) = node.lease {
                    self.state.etcd.resign(election, lease);
                    // It enters the election again at once, behind the candidates there.
                    self.state.etcd.campaign(election, lease, n);
                }
            }
            Action::Crash(n) => {
                self.state.faults += 1;
                let node = &mut self.state.nodes[n];
                *node = Node {
                    alive: false,
                    pooled: node.pooled,
                    ..Node::new(node.shards, node.skew)
                };
            }
            Action::Stop(n) => {
                self.state.faults += 1;
                let shards: Vec<u32> = self.state.nodes[n].terms.keys().copied().collect();
                for shard in shards {
                    self.last_write(n, shard);
                }
                let node = &mut self.state.nodes[n];
                if let Some(lease) = node.lease {
                    self.state.etcd.revoke(lease);
                }
                *node = Node {
                    alive: false,
                    pooled: node.pooled,
                    ..Node::new(node.shards, node.skew)
                };
            }
            Action::Restart(n, shards, pooled) => {
                self.state.faults += 1;
                let node = &mut self.state.nodes[n];
                *node = Node {
                    pooled,
                    ..Node::new(shards, node.skew)
                };
            }
        }
    }

    fn step(&mut self, n: usize, inner: Inner, time: u8) {
        match inner {
            Inner::SessionLost => {
                let node = &mut self.state.nodes[n];
                node.lease = None;
                node.terms.clear();
            }
            Inner::Join => {
                let expires = time + self.model.ttl;
                let model = self.model;
                let node = &self.state.nodes[n];
                let families = model.member_families(node.shards, model.in_pool(n, node));
                let elections: Vec<_> = model
                    .slots(n, node)
                    .into_iter()
                    .map(|slot| model.election(n, node, slot))
                    .collect();
                let lease = self.state.etcd.grant(n, families, expires);
                for election in elections {
                    self.state.etcd.campaign(election, lease, n);
                }
                let node = &mut self.state.nodes[n];
                node.lease = Some(lease);
                node.valid_until = expires;
            }
            Inner::Lead(shard) => {
                self.lead(n, shard);
                self.read(n, shard);
            }
            Inner::Send(shard) => self.send(n, shard, false),
            Inner::Reread(shard) => self.reread(n, shard),
            Inner::FleetChange(shard) => self.fleet_change(n, shard),
            Inner::Read(shard) => self.read(n, shard),
            Inner::Prepare(shard) => self.prepare(n, shard),
            Inner::Fire(shard, job, tick) => self.fire(n, shard, job, tick),
        }
    }

    fn term(&mut self, n: usize, shard: u32) -> Option<&mut Term> {
        self.state.nodes[n].terms.get_mut(&shard)
    }

    fn lead(&mut self, n: usize, shard: u32) {
        let node = &self.state.nodes[n];
        let Some(lease) = node.lease else { return };
        let Some(own) = self.state.etcd.candidate(self.model.election(n, node, shard), lease) else {
            return;
        };
        let book = self
            .model
            .jobs_in(n, node, shard)
            .into_iter()
            .map(|job| (job, None))
            .collect::<BTreeMap<_, _>>();
        let term = Term {
            term: own.create_revision,
            behind: book.keys().copied().collect(),
            book,
            owed: Owed::default(),
            unrecorded: BTreeSet::new(),
            counts_seen: self.state.etcd.live_families(),
            write: None,
        };
        self.state.nodes[n].terms.insert(shard, term);
    }

    fn read(&mut self, n: usize, shard: u32) {
        let etcd = self.state.etcd.clone();
        if let Some(term) = self.term(n, shard) {
            for (job, entry) in term.book.iter_mut().filter(|(_, entry)| entry.is_none()) {
                let seen = etcd.seen(*job);
                *entry = Some((seen.mod_revision, seen.claim));
            }
        }
    }

    fn fleet_change(&mut self, n: usize, shard: u32) {
        let live = self.state.etcd.live_families();
        let reset = self.model.rules == Rules::ResetOwed;
        let Some(term) = self.term(n, shard) else { return };
        if !counts_gone(&term.counts_seen, &live).is_empty() {
            // A count has gone: its leaders' debts are ours now; a new term of the same
            // leadership reads every record again.
            term.behind = term.book.keys().copied().collect();
            for entry in term.book.values_mut() {
                *entry = None;
            }
            if reset {
                term.owed = Owed::default();
            }
        }
        term.counts_seen = live;
    }

    /// Works out the term's next write, or works out again one that was not settled, and
    /// checks the lease by the node's own clock.
    fn prepare(&mut self, n: usize, shard: u32) {
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

    fn send(&mut self, n: usize, shard: u32, lost_reply: bool) {
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

    fn reread(&mut self, n: usize, shard: u32) {
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

    fn fire(&mut self, n: usize, shard: u32, job: usize, tick: i64) {
        let time = self.state.time;
        let name = self.model.jobs[job].name.clone();
        let shards = self.model.family_code(n, &self.state.nodes[n], shard);
        let placed = self.model.may_run(n, job, shard);
        let node = &mut self.state.nodes[n];
        if !node.live(time) || node.now(time) < tick {
            return;
        }
        let Some(term) = node.terms.get_mut(&shard) else { return };
        let Some(fence) = term.owed.begin(&name, at(tick)) else {
            return;
        };
        term.owed.started(&name, at(tick));
        let redelivered = term.owed.take_redelivery(&name, at(tick));
        term.unrecorded.insert(job);
        node.started_here.insert((job, tick));
        let start = Start {
            job,
            tick,
            fence,
            redelivered,
            shards,
            placed,
        };
        super::properties::on_start(self.model, &mut self.state.log, start);
    }

    /// The last write of a term that ends by choice: its starts, and what it still owes marked
    /// released. Dropped if its guards fail: the next leader delivers those ticks again.
    fn last_write(&mut self, n: usize, shard: u32) {
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
