//! A node of the model: its session, its terms, and the steps it takes, each a call of the
//! protocol's functions carried out against the abstract etcd.

use std::collections::{BTreeMap, BTreeSet};

use super::{at, Action, Protocol, Rules, Start, State};
use crate::rules::protocol::{counts_gone, Owed, Want};
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
    pub(super) fn now(&self, time: u8) -> i64 {
        i64::from(time) + i64::from(self.skew)
    }

    pub(super) fn live(&self, time: u8) -> bool {
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

    pub(super) fn term(&mut self, n: usize, shard: u32) -> Option<&mut Term> {
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
    pub(super) fn fire(&mut self, n: usize, shard: u32, job: usize, tick: i64) {
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
}
