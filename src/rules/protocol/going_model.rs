//! `overlap = "skip"` across nodes as a [`stateright`] model: the runs a job's record lists as
//! going ([`going_after`], riding each claim) and what a leader makes of a listed run
//! ([`verdict`], [`skips_beside`]), while the leader may stop gracefully (its run going on
//! under the grace), crash (its command orphaned) or be cut off past its lease, and a run's
//! record of its end and its node's answers land after any other step. One job is due at
//! every step and runs for three; a run started at one step is listed by the claim of the next,
//! as starts ride claims. A node that loses its lease by its own clock kills the run it listed
//! on it. A leader keeps one tick waiting beside listed runs: one still waiting when the next
//! is due gives way to it.
//!
//! Properties: two runs of the job never go at once, but for a crashed node's orphan, which
//! nothing can stop; and a tick is skipped beside another node's run only if that run was
//! going when the tick was due (a listing alone may be old: the run may have ended long ago
//! with its end not yet written).

use std::time::Duration;

use chrono::DateTime;
use stateright::{Checker, HasDiscoveries, Model, Property};

use super::elsewhere::{skips_beside, verdict, Answer, Shown, Verdict};
use super::going_after;
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
    /// A leader skips by the listing alone, as long as etcd shows no end of the run.
    SkipByListing,
    /// A leader skips on any answer that the run goes, however short it had gone on.
    SkipOnAnyAnswer,
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
    tick: i64,
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

/// A tick the leader holds back beside the runs its claim found listed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Waiting {
    due: i64,
    beside: Vec<Going>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    time: i64,
    leader: Option<usize>,
    waiting: Option<Waiting>,
    record: Vec<Going>,
    result: Option<i64>,
    /// Whether etcd holds each node's lease.
    lease: Vec<bool>,
    nodes: Vec<Node>,
    /// Fences a leader asked about that their node has not answered yet.
    asked: Vec<i64>,
    /// The answers in etcd, by fence.
    answers: Vec<(i64, Answer)>,
    /// Every run that ended: fence, start, end.
    ended: Vec<(i64, i64, i64)>,
    next_fence: i64,
    faults: u8,
    overlapped: bool,
    skipped_beside_ended: bool,
    /// Examples the sound rules must reach, lest they hold by doing nothing.
    skipped_beside_going: bool,
    started_on_answer: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Step,
    WriteResult(usize),
    Answer(usize),
    Decide,
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

fn seconds(age: i64) -> Duration {
    Duration::from_secs(age.unsigned_abs())
}

fn listed(node: usize, run: Run) -> Going {
    Going {
        node: node.to_string(),
        tick: at(run.tick),
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
        let seen = state.nodes[writer].seen_ended;
        let mut going = going_after(Some(&current), own, &writer.to_string(), |run| {
            seen.is_some_and(|seen| run.fence <= seen)
        });
        if self.rules == Rules::DropOthers {
            going.retain(|run| run.node == writer.to_string());
        }
        state.record = going;
    }

    /// The leader's tick at `state.time`: its claim writes the record (carrying its run's
    /// start), then the tick waits beside the other nodes' runs the record lists, unless a run
    /// of its own goes (a wait on one node, not modelled here).
    fn fire(&self, state: &mut State, leader: usize) {
        self.write(state, leader);
        state.waiting = None;
        if state.nodes[leader].run.is_some() {
            return;
        }
        let me = leader.to_string();
        let seen = state.nodes[leader].seen_ended;
        let beside = state
            .record
            .iter()
            .filter(|run| run.node != me && seen.is_none_or(|seen| run.fence > seen))
            .cloned()
            .collect();
        state.waiting = Some(Waiting {
            due: state.time,
            beside,
        });
        self.decide(state, leader);
    }

    /// The leader looks at each run its waiting tick waits beside, as etcd shows it now: it
    /// starts the tick once all ended, skips it, or asks and waits.
    fn decide(&self, state: &mut State, leader: usize) {
        let Some(waiting) = state.waiting.clone() else {
            return;
        };
        for run in &waiting.beside {
            let holder: usize = run.node.parse().unwrap_or_default();
            let shown = Shown {
                // The job's result says only whether it is this run's; a later one hides it.
                end_recorded: state.result == Some(run.fence),
                lease_held: state.lease[holder],
                answer: state
                    .answers
                    .iter()
                    .find(|(fence, _)| *fence == run.fence)
                    .map(|(_, answer)| *answer),
            };
            let since = (run.since - at(0)).num_seconds();
            let listing_age = seconds(state.time - since);
            let due = at(waiting.due);
            let skips = match (verdict(&shown), self.rules) {
                (Verdict::Ended, _) => {
                    state.started_on_answer |= shown.answer == Some(Answer::Ended) && shown.lease_held;
                    let seen = state.nodes[leader].seen_ended.get_or_insert(run.fence);
                    *seen = (*seen).max(run.fence);
                    continue;
                }
                (_, Rules::IgnoreGoing) => continue,
                (_, Rules::SkipByListing) => skips_beside(run, listing_age, due),
                (Verdict::WentOnFor(_), Rules::SkipOnAnyAnswer) => true,
                (Verdict::WentOnFor(age), _) => skips_beside(run, age, due),
                (Verdict::Unknown, _) => false,
            };
            if skips {
                let going = going_at(state, run.fence, waiting.due);
                state.skipped_beside_ended |= !going;
                state.skipped_beside_going |= going;
                state.waiting = None;
            } else {
                // Asks again: the last answer may be too old to tell.
                state.answers.retain(|(fence, _)| *fence != run.fence);
                if !state.asked.contains(&run.fence) {
                    state.asked.push(run.fence);
                }
            }
            return;
        }
        state.waiting = None;
        let fence = state.next_fence;
        state.next_fence += 1;
        state.nodes[leader].run = Some(Run {
            fence,
            tick: waiting.due,
            since: state.time,
            ends_at: state.time + RUN_FOR,
        });
    }
}

/// Whether the run with `fence` was going at `time`, by what happened, not what etcd shows.
fn going_at(state: &State, fence: i64, time: i64) -> bool {
    let going_now = state
        .nodes
        .iter()
        .filter_map(|node| node.run)
        .find(|run| run.fence == fence);
    if let Some(run) = going_now {
        return run.since <= time;
    }
    state
        .ended
        .iter()
        .any(|&(ended, since, end)| ended == fence && since <= time && time < end)
}

fn end_run(state: &mut State, node: usize) {
    if let Some(run) = state.nodes[node].run.take() {
        state.ended.push((run.fence, run.since, state.time));
        state.nodes[node].unwritten = Some(run.fence);
    }
}

impl Model for Going1 {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            time: 0,
            leader: Some(0),
            waiting: None,
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
            asked: Vec::new(),
            answers: Vec::new(),
            ended: Vec::new(),
            next_fence: 1,
            faults: 0,
            overlapped: false,
            skipped_beside_ended: false,
            skipped_beside_going: false,
            started_on_answer: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.time < self.horizon {
            actions.push(Action::Step);
        }
        if state.leader.is_some() && state.waiting.is_some() {
            actions.push(Action::Decide);
        }
        for (index, node) in state.nodes.iter().enumerate() {
            let reaches_etcd = matches!(node.up, Up::Live | Up::Stopping);
            if node.unwritten.is_some() && reaches_etcd {
                actions.push(Action::WriteResult(index));
            }
            let asked_here = state.asked.iter().any(|fence| {
                state
                    .record
                    .iter()
                    .chain(state.waiting.iter().flat_map(|waiting| &waiting.beside))
                    .any(|run| run.fence == *fence && run.node == index.to_string())
            });
            if asked_here && reaches_etcd {
                actions.push(Action::Answer(index));
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
                for index in 0..next.nodes.len() {
                    if next.nodes[index].run.is_some_and(|run| run.ends_at <= next.time) {
                        end_run(&mut next, index);
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
            Action::Answer(index) => {
                let run = next.nodes[index].run;
                let mine: Vec<i64> = next
                    .asked
                    .iter()
                    .copied()
                    .filter(|fence| {
                        next.record
                            .iter()
                            .chain(next.waiting.iter().flat_map(|waiting| &waiting.beside))
                            .any(|going| going.fence == *fence && going.node == index.to_string())
                    })
                    .collect();
                for fence in mine {
                    let answer = match run.filter(|run| run.fence == fence) {
                        Some(run) => Answer::Going {
                            age: seconds(next.time - run.since),
                        },
                        None => Answer::Ended,
                    };
                    next.asked.retain(|asked| *asked != fence);
                    next.answers.retain(|(answered, _)| *answered != fence);
                    next.answers.push((fence, answer));
                }
            }
            Action::Decide => {
                if let Some(leader) = next.leader {
                    self.decide(&mut next, leader);
                }
            }
            Action::Lead(index) => next.leader = Some(index),
            Action::Stop(index) => {
                next.faults += 1;
                next.nodes[index].up = Up::Stopping;
                if next.leader == Some(index) {
                    // The last write of its leadership lists its run going; then it resigns.
                    self.write(&mut next, index);
                    next.leader = None;
                    next.waiting = None;
                }
            }
            Action::Crash(index) => {
                next.faults += 1;
                next.nodes[index].up = Up::Crashed;
                next.lease[index] = false;
                if next.leader == Some(index) {
                    next.leader = None;
                    next.waiting = None;
                }
            }
            Action::Cut(index) => {
                next.faults += 1;
                next.nodes[index].up = Up::Cut;
                next.lease[index] = false;
                if next.leader == Some(index) {
                    next.leader = None;
                    next.waiting = None;
                }
                if self.rules != Rules::RunOnWhenCut {
                    // Its lease lapsed by its own clock: the run it listed on it is killed.
                    end_run(&mut next, index);
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
        vec![
            Property::always(NO_OVERLAP, |_: &Going1, state: &State| !state.overlapped),
            Property::always(NO_SKIP_BESIDE_ENDED, |_: &Going1, state: &State| {
                !state.skipped_beside_ended
            }),
            Property::sometimes(SKIPS, |_: &Going1, state: &State| state.skipped_beside_going),
            Property::sometimes(STARTS_ON_ANSWER, |_: &Going1, state: &State| state.started_on_answer),
        ]
    }
}

const NO_OVERLAP: &str = "two runs never go at once, a crashed node's orphan aside";
const NO_SKIP_BESIDE_ENDED: &str = "a tick is skipped only beside a run going when it was due";
const SKIPS: &str = "a tick is skipped beside another node's run going when it was due";
const STARTS_ON_ANSWER: &str = "a tick starts once a run's node answered it ended, before its end was written";

/// A record with nothing but the runs going that the model reads.
fn record(going: Vec<Going>) -> Claim {
    Claim {
        going,
        ..Claim::default()
    }
}

/// The property `rules` breaks within the bounds, if any.
fn check(nodes: usize, faults: u8, rules: Rules) -> Option<&'static str> {
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
    if rules == Rules::Sound {
        for example in [SKIPS, STARTS_ON_ANSWER] {
            assert!(checker.discovery(example).is_some(), "never reached: {example}");
        }
    }
    [NO_OVERLAP, NO_SKIP_BESIDE_ENDED].into_iter().find(|property| {
        checker.discovery(property).is_some_and(|path| {
            println!("  {property}: {:?}", path.into_actions());
            true
        })
    })
}

#[test]
fn no_tick_starts_beside_a_run_going_on_another_node_nor_skips_beside_one_ended() {
    assert_eq!(check(2, 1, Rules::Sound), None);
    assert_eq!(check(3, 2, Rules::Sound), None);
}

#[test]
fn the_checker_catches_each_rule_taken_away() {
    let cases = [
        (2, 1, Rules::IgnoreGoing, NO_OVERLAP),
        (2, 1, Rules::RunOnWhenCut, NO_OVERLAP),
        (3, 2, Rules::DropOthers, NO_OVERLAP),
        (2, 1, Rules::SkipByListing, NO_SKIP_BESIDE_ENDED),
        (2, 1, Rules::SkipOnAnyAnswer, NO_SKIP_BESIDE_ENDED),
    ];
    for (nodes, faults, rules, broken) in cases {
        assert_eq!(check(nodes, faults, rules), Some(broken), "{rules:?}");
    }
}
