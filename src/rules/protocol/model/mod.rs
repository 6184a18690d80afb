//! The claim protocol as a [`stateright`] model: nodes that lead shards of one or two shard
//! counts over an [abstract etcd](etcd), taking every decision with the functions of
//! [`crate::rules::protocol`] that the node runs, while any node may crash, stall past its lease,
//! lose a reply after its write committed, stop gracefully, hand a shard over, or come back with
//! another shard count, on clocks apart by a bounded skew. Time moves in whole seconds; every job
//! fires each second. The properties are in [`properties`].
//!
//! A node acts only while its lease holds by its own reckoning, as the node's `check_live` does;
//! a stall is a node that does nothing while time moves on, and a write it prepared before the
//! stall may reach etcd after its lease expired, where the guards decide.

mod etcd;
mod next;
mod node;
mod placement;
mod properties;
#[cfg(test)]
mod tests;
mod write;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use stateright::{Model, Property};

use crate::rules::config::{CatchUp, Delivery, Job};
pub(crate) use etcd::Etcd;
pub(crate) use node::{Node, Step};

/// The instant of model second `second`.
pub(crate) fn at(second: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(1_800_000_000 + second, 0).unwrap_or_default()
}

/// The model second of `instant`.
pub(crate) fn second(instant: DateTime<Utc>) -> i64 {
    instant.timestamp() - 1_800_000_000
}

/// Which rules the nodes follow: the node's own, or one broken on purpose to see the checker
/// catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rules {
    /// The rules the node runs.
    Sound,
    /// Before #27: a writer lists every other leader's pending ticks as its own, and a takeover
    /// settles every debt whatever its shard count.
    BeforeIssue27,
    /// A claim without the leadership's guard.
    Unguarded,
    /// A new term of the same leadership starts owing nothing.
    ResetOwed,
    /// Before #29: a takeover whose record another leader wrote first drops what it settled.
    DropSettlesOnChange,
    /// Before #29: ticks a takeover records lost are recorded after the claim that drops them.
    LostAfterClaim,
    /// Before #29: a last write marks released even ticks adopted from a leader that may have
    /// started them.
    ReleaseAdopted,
    /// Before #29: an on-time claim that finds the record moved by another leader claims only
    /// its own tick, not the ticks between.
    SkipGap,
    /// A node without the pool's tags campaigns in its election all the same.
    AnyNodeInPool,
    /// A record names a pool leader's debts by shard count alone, as if the leader were one of
    /// the fleet's single shard.
    FamilyByCount,
}

/// What the checker explores: the fleet, its jobs, and the faults it may meet.
#[derive(Clone)]
pub(crate) struct Protocol {
    pub(crate) nodes: usize,
    /// Every job fires each second; their names place them in shards.
    pub(crate) jobs: Vec<Arc<Job>>,
    /// The shard count every node starts with, then the one a restart may bring.
    pub(crate) counts: Vec<u32>,
    /// Lease TTL, in seconds.
    pub(crate) ttl: u8,
    /// The last second a tick is claimed for and a fault may happen; time then runs on until
    /// every dead node's lease is gone.
    pub(crate) horizon: u8,
    /// At most how many seconds a node's clock is ahead of or behind true time.
    pub(crate) skew: u8,
    /// At most how many faults a run meets.
    pub(crate) faults: u8,
    pub(crate) rules: Rules,
    /// A node's starts interleave with its writes (a start between a write's preparation and
    /// its reply), as its runs do beside its claims; otherwise it starts between writes.
    pub(crate) concurrent_starts: bool,
    /// Which nodes have the pool's tags (see [`placement`]); missing: every node.
    pub(crate) tagged: Vec<bool>,
    /// A restart may also bring the config in which the pool's jobs have no `run_on` yet, so
    /// they are the fleet's: a rollout of a `run_on` change.
    pub(crate) rollout: bool,
}

impl Protocol {
    /// `nodes` nodes, the jobs named with their delivery, faults up to `faults`.
    pub(crate) fn new(nodes: usize, jobs: &[(&str, Delivery)], counts: &[u32], faults: u8) -> Protocol {
        Protocol {
            nodes,
            jobs: jobs
                .iter()
                .map(|(name, delivery)| {
                    Arc::new(Job {
                        delivery: *delivery,
                        catch_up: CatchUp::All,
                        ..Job::for_tests(name, "* * * * * *")
                    })
                })
                .collect(),
            counts: counts.to_vec(),
            ttl: 2,
            horizon: 3,
            skew: 0,
            faults,
            rules: Rules::Sound,
            concurrent_starts: false,
            tagged: Vec::new(),
            rollout: false,
        }
    }

    /// Puts the jobs named in `pooled` in the pool (`run_on`), which only the nodes `tagged`
    /// says have the tags of.
    pub(crate) fn with_pool(mut self, pooled: &[&str], tagged: &[bool]) -> Protocol {
        let tags = crate::rules::pools::Tags::parse("p").unwrap_or_default();
        for job in &mut self.jobs {
            if pooled.contains(&job.name.as_str()) {
                *job = Arc::new(Job {
                    run_on: tags.clone(),
                    ..(**job).clone()
                });
            }
        }
        self.tagged = tagged.to_vec();
        self
    }

    /// Adds a `fan_out = "all"` job `name`: one instance per node, each in the node's own
    /// election.
    pub(crate) fn with_fan_out(mut self, name: &str, delivery: Delivery) -> Protocol {
        let job = Job {
            delivery,
            catch_up: CatchUp::All,
            fan_out: crate::rules::pools::FanOut::All,
            ..Job::for_tests(name, "* * * * * *")
        };
        for node in 0..self.nodes {
            self.jobs.push(Arc::new(job.instance(&node.to_string())));
        }
        self
    }

    /// The last second: every dead node's lease has expired by then, and every clock has
    /// reached the horizon.
    pub(crate) fn end(&self) -> u8 {
        self.horizon + self.ttl + self.skew + 1
    }
}

/// Everything the fleet and etcd hold, and what has happened.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct State {
    pub(crate) time: u8,
    pub(crate) faults: u8,
    pub(crate) etcd: Etcd,
    pub(crate) nodes: Vec<Node>,
    pub(crate) log: Log,
}

/// What has happened, as much as the properties need: states that differ only in the order of
/// past starts are one state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Log {
    /// Per (job, tick): how many times it started, and the fence of its last start.
    pub(crate) started: BTreeMap<(usize, i64), (u8, i64)>,
    /// Per (job, shard count): the highest fence a start by a leader of that count carried.
    pub(crate) highest: BTreeMap<(usize, u32), i64>,
    /// Ticks recorded lost: claimed and never started, not run again.
    pub(crate) recorded: BTreeSet<(usize, i64)>,
    /// Ticks a committed write claimed (new or adopted).
    pub(crate) claimed: BTreeSet<(usize, i64)>,
    /// The properties a start broke.
    pub(crate) broken: BTreeSet<&'static str>,
}

/// One start of a job's command.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Start {
    pub(crate) job: usize,
    pub(crate) tick: i64,
    /// Its `CRON_FENCE`.
    pub(crate) fence: i64,
    /// Its `CRON_REDELIVERED`.
    pub(crate) redelivered: bool,
    /// The election family whose leader started it (see [`Protocol::family_code`]).
    pub(crate) shards: u32,
    /// It ran where its config lets it: a pool's job on a node with the tags, an instance on
    /// its own node.
    pub(crate) placed: bool,
}

/// What may happen next: time passes, a node takes its next step or starts a tick it owes, or
/// a fault. A node's own steps follow the order its code takes them; the checker interleaves
/// the nodes, the starts and the faults in every order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// A second passes: every node that is neither stalled nor dead renews its lease, and the
    /// leases gone by then expire.
    Tick,
    /// The node's next step ([`node::Inner`]).
    Step(usize, node::Inner),
    /// The node's next step is a write: it commits and its reply is lost.
    LoseReply(usize, u32),
    /// The node stops renewing and acting until its lease has expired.
    Stall(usize),
    Crash(usize),
    /// A graceful stop: the last write of every term, then the lease revoked.
    Stop(usize),
    /// A node hands a shard over: writes its last starts, then resigns.
    Resign(usize, u32),
    /// A node that crashed or stopped comes back with a shard count, and with the pool in its
    /// config or not (see [`Protocol::rollout`]).
    Restart(usize, u32, bool),
    /// With [`Protocol::concurrent_starts`]: the node starts a tick it owes, whatever write is
    /// in flight (node, shard, job, tick).
    Fire(usize, u32, usize, i64),
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let skews: Vec<i8> = (-(self.skew as i8)..=self.skew as i8).collect();
        let mut assignments: Vec<Vec<i8>> = vec![Vec::new()];
        for node in 0..self.nodes {
            // The first node's clock is the reference: only the others' differ from it.
            let choices: &[i8] = if node == 0 { &[0] } else { &skews };
            assignments = assignments
                .into_iter()
                .flat_map(|partial| {
                    choices.iter().map(move |skew| {
                        let mut next = partial.clone();
                        next.push(*skew);
                        next
                    })
                })
                .collect();
        }
        assignments
            .into_iter()
            .map(|skews| State {
                time: 0,
                faults: 0,
                etcd: Etcd::default(),
                nodes: skews.into_iter().map(|skew| Node::new(self.counts[0], skew)).collect(),
                log: Log::default(),
            })
            .collect()
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        Step::actions(self, state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        Step {
            model: self,
            state: &mut next,
        }
        .apply(action);
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}

/// A counterexample, one action a line, then the records and the log it ends with.
#[cfg(test)]
pub(crate) fn trace(path: &stateright::Path<State, Action>) -> String {
    let mut lines: Vec<String> = path
        .clone()
        .into_actions()
        .iter()
        .map(|action| format!("  {action:?}"))
        .collect();
    let last = path.last_state();
    for (job, (revision, claim)) in &last.etcd.records {
        let debts: Vec<String> = claim
            .debts()
            .map(|debt| {
                let ticks: Vec<i64> = debt.pending.iter().map(|tick| second(*tick)).collect();
                format!(
                    "term {} node {} shards {:?}: {ticks:?}",
                    debt.term, debt.node, debt.shards
                )
            })
            .collect();
        lines.push(format!(
            "  record of job {job} at revision {revision}: last tick {}, pending {debts:?}",
            second(claim.scheduled_at)
        ));
    }
    lines.push(format!(
        "  started (job, tick) -> (times, fence): {:?}",
        last.log.started
    ));
    lines.push(format!(
        "  claimed: {:?}; recorded lost: {:?}",
        last.log.claimed, last.log.recorded
    ));
    lines.join("\n")
}
