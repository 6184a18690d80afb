//! `overlap = "skip"` across nodes as a [`stateright`] model: the runs a job's record lists as
//! going ([`going_after`], riding each claim) and the rule a leader starts a tick by
//! ([`run_ended`]), while the leader may stop gracefully (its run going on under the grace),
//! crash (its command orphaned) or be cut off past its lease. One job fires at every step and
//! runs for three; a run started at one step is listed by the claim of the next, as starts ride
//! claims. A node that loses its lease by its own clock kills the run it listed on it.
//!
//! Property: two runs of the job never go at once, but for a crashed node's orphan, which
//! nothing can stop.

use chrono::DateTime;
use stateright::{Checker, HasDiscoveries, Model, Property};

use super::{going_after, run_ended};
use crate::rules::record::{Claim, Going};

/// The node's rules, or one broken on purpose to see the checker catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rules {
    Sound,
    /// A leader starts its tick whatever the record lists as going elsewhere.
    IgnoreGoing,
    /// A writer lists only its own run, dropping other nodes' it has not seen end.
    DropOthers,
    /// A node cut off past its lease lets its run go on.
    RunOnWhenCut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Up {
    Live,
    /// Stopped gracefully: no leadership, its run goes on under the grace.
    Stopping,
    /// Its command runs on, unseen.
    Crashed,
    /// Its lease expired while it could not reach etcd.
    Cut,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Run {
    fence: i64,
    since: i64,
    ends_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Node {
    up: Up,
    run: Option<Run>,
    /// A run that ended whose result is not written yet.
    unwritten: Option<i64>,
    /// The highest fence of another node's run it saw end.
    seen_ended: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    time: i64,
    leader: Option<usize>,
    record: Vec<Going>,
    result: Option<i64>,
    /// Whether etcd holds each node's lease.
    lease: Vec<bool>,
    nodes: Vec<Node>,
    next_fence: i64,
    faults: u8,
    overlapped: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Step,
    WriteResult(usize),
    Lead(usize),
    Stop(usize),
    Crash(usize),
    Cut(usize),
}

#[derive(Clone)]
struct Going1 {
    nodes: usize,
    horizon: i64,
    faults: u8,
    rules: Rules,
}

const RUN_FOR: i64 = 3;

fn at(second: i64) -> chrono::DateTime<chrono::Utc> {
    DateTime::from_timestamp(1_800_000_000 + second, 0).unwrap_or_default()
}

fn listed(node: usize, run: Run) -> Going {
    Going {
        node: node.to_string(),
        tick: at(run.since),
        fence: run.fence,
        lease: node as i64,
        since: at(run.since),
    }
}

impl Going1 {
    /// The record `writer` writes over the current one: its own run, and the others'.
    fn write(&self, state: &mut State, writer: usize) {
        let current = record(state.record.clone());
        let own = state.nodes[writer].run.map(|run| listed(writer, run));
        let mut going = going_after(Some(&current), own, &writer.to_string(), state.nodes[writer].seen_ended);
        if self.rules == Rules::DropOthers {
            going.retain(|run| run.node == writer.to_string());
        }
        state.record = going;
    }

    /// The leader's tick at `state.time`: its claim writes the record (carrying its run's
    /// start), then it starts the tick unless a run goes here or, as etcd shows, elsewhere.
    fn fire(&self, state: &mut State, leader: usize) {
        self.write(state, leader);
        if state.nodes[leader].run.is_some() {
            return;
        }
        let me = leader.to_string();
        let going_elsewhere: Vec<Going> = state
            .record
            .iter()
            .filter(|run| run.node != me && state.nodes[leader].seen_ended.is_none_or(|seen| run.fence > seen))
            .cloned()
            .collect();
        for run in &going_elsewhere {
            let holder: usize = run.node.parse().unwrap_or_default();
            if run_ended(state.result, state.lease[holder], run) {
                let seen = state.nodes[leader].seen_ended.get_or_insert(run.fence);
                *seen = (*seen).max(run.fence);
            } else if self.rules != Rules::IgnoreGoing {
                return;
            }
        }
        let fence = state.next_fence;
        state.next_fence += 1;
        state.nodes[leader].run = Some(Run {
            fence,
            since: state.time,
            ends_at: state.time + RUN_FOR,
        });
    }
}

impl Model for Going1 {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            time: 0,
            leader: Some(0),
            record: Vec::new(),
            result: None,
            lease: vec![true; self.nodes],
            nodes: vec![
                Node {
                    up: Up::Live,
                    run: None,
                    unwritten: None,
                    seen_ended: None,
                };
                self.nodes
            ],
            next_fence: 1,
            faults: 0,
            overlapped: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.time < self.horizon {
            actions.push(Action::Step);
        }
        for (index, node) in state.nodes.iter().enumerate() {
            if node.unwritten.is_some() && matches!(node.up, Up::Live | Up::Stopping) {
                actions.push(Action::WriteResult(index));
            }
            if node.up == Up::Live && state.leader.is_none() {
                actions.push(Action::Lead(index));
            }
            if node.up == Up::Live && state.faults < self.faults {
                actions.push(Action::Stop(index));
                actions.push(Action::Crash(index));
                actions.push(Action::Cut(index));
            }
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        match action {
            Action::Step => {
                next.time += 1;
                for node in &mut next.nodes {
                    if let Some(run) = node.run.filter(|run| run.ends_at <= next.time) {
                        node.run = None;
                        node.unwritten = Some(run.fence);
                    }
                }
                // A node stopping gracefully gives its lease back once its run has ended.
                for (index, node) in next.nodes.iter().enumerate() {
                    if node.up == Up::Stopping && node.run.is_none() && node.unwritten.is_none() {
                        next.lease[index] = false;
                    }
                }
                if let Some(leader) = next.leader {
                    self.fire(&mut next, leader);
                }
            }
            Action::WriteResult(index) => {
                let fence = next.nodes[index].unwritten.take();
                next.result = next.result.max(fence);
            }
            Action::Lead(index) => next.leader = Some(index),
            Action::Stop(index) => {
                next.faults += 1;
                next.nodes[index].up = Up::Stopping;
                if next.leader == Some(index) {
                    // The last write of its leadership lists its run going; then it resigns.
                    self.write(&mut next, index);
                    next.leader = None;
                }
            }
            Action::Crash(index) => {
                next.faults += 1;
                next.nodes[index].up = Up::Crashed;
                next.lease[index] = false;
                if next.leader == Some(index) {
                    next.leader = None;
                }
            }
            Action::Cut(index) => {
                next.faults += 1;
                next.nodes[index].up = Up::Cut;
                next.lease[index] = false;
                if next.leader == Some(index) {
                    next.leader = None;
                }
                if self.rules != Rules::RunOnWhenCut {
                    // Its lease lapsed by its own clock: the run it listed on it is killed.
                    next.nodes[index].run = None;
                }
            }
        }
        let going = next
            .nodes
            .iter()
            .filter(|node| node.up != Up::Crashed && node.run.is_some())
            .count();
        next.overlapped |= going > 1;
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::always(NO_OVERLAP, |_: &Going1, state: &State| {
            !state.overlapped
        })]
    }
}

const NO_OVERLAP: &str = "two runs never go at once, a crashed node's orphan aside";

/// A record with nothing but the runs going that the model reads.
fn record(going: Vec<Going>) -> Claim {
    Claim {
        scheduled_at: at(0),
        term: 1,
        node: String::new(),
        pending: Vec::new(),
        shards: None,
        pool: None,
        schedule: None,
        others: Vec::new(),
        released: false,
        going,
    }
}

fn check(nodes: usize, faults: u8, rules: Rules) -> bool {
    let model = Going1 {
        nodes,
        horizon: 8,
        faults,
        rules,
    };
    let checker = model
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    println!(
        "going model {rules:?} ({nodes} nodes, {faults} faults): {} states",
        checker.unique_state_count()
    );
    match checker.discovery(NO_OVERLAP) {
        Some(path) => {
            println!("  {:?}", path.into_actions());
            false
        }
        None => true,
    }
}

#[test]
fn no_tick_starts_beside_a_run_going_on_another_node() {
    assert!(check(2, 1, Rules::Sound));
    assert!(check(3, 2, Rules::Sound));
}

#[test]
fn the_checker_catches_each_rule_taken_away() {
    assert!(!check(2, 1, Rules::IgnoreGoing), "a leader that ignores the record");
    assert!(
        !check(2, 1, Rules::RunOnWhenCut),
        "a cut-off node that lets its run go on"
    );
    assert!(
        !check(3, 2, Rules::DropOthers),
        "a writer that drops another node's run"
    );
}
