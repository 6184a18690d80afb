//! The slot protocol of concurrency groups as a [`stateright`] model: attempts on a few nodes
//! take slots, wait in line, hand slots on and give up over an abstract etcd, deciding with
//! [`admit`] and [`heir`] as the node does, while a node may crash or stall past its lease and
//! wake. A write is prepared from what the node read and lands later, so every other step may
//! come between the two, and etcd's guards decide, as they do for `coord::groups`.
//!
//! A take's reply may be lost (the write lands or not, the attempt does not know which), and a
//! call to leave the line may fail; the limit may be lowered (a reload of every node) while
//! attempts run and wait.
//!
//! Properties: never more than `limit` attempts running on nodes that run (a crashed or stalled
//! node's command runs on beyond the model, as documented), by the limit lowered to once every
//! run that went when it was lowered has ended; once every attempt has ended, no slot and no
//! place in line is left on a live lease; every attempt ends.

use std::collections::{BTreeMap, BTreeSet};

use chrono::DateTime;
use stateright::{Checker, HasDiscoveries, Model, Property};

use super::{admit, admit_counted, heir, within, Admission, Line, Place};

/// The node's rules, or one broken on purpose to see the checker catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rules {
    Sound,
    /// A slot is taken without the guard that it is free.
    NoFreeGuard,
    /// A slot is handed to the first in line without the guard that it still waits.
    NoHeirGuard,
    /// A node that wakes after its lease expired lets the runs that held its slots go on.
    RunOnAfterLapse,
    /// The rules before lost replies were looked at: a take whose reply is lost counts as
    /// refused (the attempt stands in line), a slot handed to an attempt in line leaves its
    /// place there, and a failed call to leave the line leaves the place.
    TrustLostReplies,
    /// The rules before a lowered limit was looked at: slots are handed on and run in whatever
    /// their number, and a take counts only the free slots below the limit.
    LimitAtTake,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Up {
    Live,
    Stalled,
    Crashed,
}

/// Where an attempt is; a `Taking`, `Releasing` or `Leaving` write was prepared and not landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Attempt {
    Idle,
    InLine,
    Taking {
        slot: u32,
        in_line: bool,
        lease: u8,
    },
    /// A take whose reply was lost: it may have landed.
    Unsure {
        in_line: bool,
    },
    Running(u32),
    /// Its command ended: it hands its slot on.
    Ending(u32),
    Releasing {
        slot: u32,
        heir: Option<usize>,
        lease: u8,
    },
    Leaving {
        lease: u8,
    },
    Done,
    GaveUp,
    /// Killed by its node on waking to a lost lease.
    Killed,
    /// Its node crashed.
    Dead,
}

impl Attempt {
    fn ended(self) -> bool {
        matches!(self, Attempt::Done | Attempt::GaveUp | Attempt::Killed | Attempt::Dead)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    /// Slot → (attempt, lease).
    slots: BTreeMap<u32, (usize, u8)>,
    /// The line: place → (attempt, lease).
    line: BTreeMap<Place, (usize, u8)>,
    live_leases: BTreeSet<u8>,
    /// Per node: whether it runs, and its lease now.
    nodes: Vec<(Up, u8)>,
    attempts: Vec<Attempt>,
    faults: u8,
    next_lease: u8,
    /// The limit now: lowered at most once, on every node at once.
    limit: u32,
    /// The attempts that ran when the limit was lowered and still do.
    ran_before: BTreeSet<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    Step(usize),
    GiveUp(usize),
    Finish(usize),
    Crash(usize),
    Stall(usize),
    Wake(usize),
    /// The take's write lands, or not, as a step would have it; its reply is lost.
    LoseReply(usize),
    /// A call to leave the line fails.
    FailLeave(usize),
    Lower,
}

#[derive(Clone)]
struct Slots {
    limit: u32,
    /// The limit a reload may lower it to.
    lowered: Option<u32>,
    /// Each attempt's node.
    on: Vec<usize>,
    nodes: usize,
    faults: u8,
    rules: Rules,
}

impl Slots {
    fn place(&self, attempt: usize) -> Place {
        Place {
            due: DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default(),
            job: format!("job{attempt}"),
            fence: 1,
        }
    }
}

fn line_of(state: &State) -> Line {
    Line {
        held: state.slots.keys().copied().collect(),
        waiting: state.line.keys().cloned().collect(),
    }
}

/// A lease etcd no longer holds takes its keys with it.
fn expire(state: &mut State, lease: u8) {
    state.live_leases.remove(&lease);
    state.slots.retain(|_, (_, held_on)| *held_on != lease);
    state.line.retain(|_, (_, held_on)| *held_on != lease);
}

impl Slots {
    /// Whether an attempt may take a slot now, by the model's rules.
    fn admission(&self, state: &State, place: &Place) -> Admission {
        let line = line_of(state);
        match self.rules {
            Rules::LimitAtTake => admit_counted(
                line.waiting.range(..place).count(),
                |slot| line.held.contains(&slot),
                0,
                state.limit,
                0,
            ),
            _ => admit(&line, place, state.limit),
        }
    }

    /// The take of `slot` lands, if etcd's guards let it: `Some(slot)` when it did and the slot
    /// is the attempt's to run in.
    fn land_take(&self, state: &mut State, attempt: usize, slot: u32, in_line: bool, lease: u8) -> Option<u32> {
        let place = self.place(attempt);
        let free = !state.slots.contains_key(&slot) || self.rules == Rules::NoFreeGuard;
        let still_in_line = !in_line || state.line.contains_key(&place);
        if !(free && still_in_line && state.live_leases.contains(&lease)) {
            return None;
        }
        state.line.remove(&place);
        let held_past = state.slots.range(state.limit..).next().is_some();
        if self.rules != Rules::LimitAtTake && (!within(slot, state.limit) || held_past) {
            // Taken past a limit lowered since the slot was chosen, or below it while slots
            // past it are held: given back at once.
            return None;
        }
        state.slots.insert(slot, (attempt, lease));
        Some(slot)
    }

    fn step(&self, state: &mut State, attempt: usize) {
        let lease = state.nodes[self.on[attempt]].1;
        let place = self.place(attempt);
        let handed = state
            .slots
            .iter()
            .find(|(_, (holder, on))| *holder == attempt && *on == lease)
            .map(|(slot, _)| *slot);
        let sound = self.rules != Rules::TrustLostReplies;
        state.attempts[attempt] = match (state.attempts[attempt], handed) {
            // As the node does on every look: a slot holding its value is its own first.
            (Attempt::Idle | Attempt::InLine, Some(slot))
                if self.rules != Rules::LimitAtTake
                    && (!within(slot, state.limit) || state.slots.range(state.limit..).next().is_some()) =>
            {
                // Handed a slot past the limit lowered since, or below it while slots past it
                // are held (handed on before the lowering reached the ender): given back, and
                // it waits again.
                state.slots.remove(&slot);
                state.line.remove(&place);
                Attempt::Idle
            }
            (Attempt::Idle | Attempt::InLine, Some(slot)) => {
                if sound && state.line.get(&place).is_some_and(|(_, on)| *on == lease) {
                    // Its place still in line (a take whose reply was lost landed before it
                    // stood there): taken out, guarded by its value.
                    state.line.remove(&place);
                }
                Attempt::Running(slot)
            }
            (Attempt::InLine, None) if !state.line.contains_key(&place) => Attempt::Idle,
            (Attempt::Idle | Attempt::InLine, _) => {
                let in_line = state.attempts[attempt] == Attempt::InLine;
                match self.admission(state, &place) {
                    Admission::Take(slot) => Attempt::Taking { slot, in_line, lease },
                    Admission::Wait if in_line => Attempt::InLine,
                    Admission::Wait => {
                        state.line.insert(place, (attempt, lease));
                        Attempt::InLine
                    }
                }
            }
            (Attempt::Taking { slot, in_line, lease }, _) => match self.land_take(state, attempt, slot, in_line, lease)
            {
                Some(slot) => Attempt::Running(slot),
                None if in_line => Attempt::InLine,
                None => Attempt::Idle,
            },
            (Attempt::Unsure { in_line }, _) if sound => match handed {
                // Read back: the take landed.
                Some(slot) if within(slot, state.limit) => Attempt::Running(slot),
                Some(slot) => {
                    state.slots.remove(&slot);
                    Attempt::Idle
                }
                None if in_line && state.line.contains_key(&place) => Attempt::InLine,
                None => Attempt::Idle,
            },
            // Counted as refused: it stands in line, whether the take landed or not.
            (Attempt::Unsure { .. }, _) => {
                state.line.insert(place, (attempt, lease));
                Attempt::InLine
            }
            (Attempt::Ending(slot), _) => {
                // Past the limit, or below it while slots past it are held: freed, not handed on.
                let held_past = state.slots.range(state.limit..).any(|(other, _)| *other != slot);
                let past = self.rules != Rules::LimitAtTake && (!within(slot, state.limit) || held_past);
                let first = heir(&line_of(state))
                    .filter(|_| !past)
                    .and_then(|place| state.line.get(place))
                    .map(|(heir, _)| *heir);
                Attempt::Releasing {
                    slot,
                    heir: first,
                    lease,
                }
            }
            (Attempt::Releasing { slot, heir, lease }, _) => {
                if state.slots.get(&slot) != Some(&(attempt, lease)) {
                    // Lapsed with its lease, maybe another's by now: left alone.
                    Attempt::Done
                } else {
                    match heir {
                        None => {
                            state.slots.remove(&slot);
                            Attempt::Done
                        }
                        Some(heir) => {
                            let heirs_place = self.place(heir);
                            match state.line.get(&heirs_place).copied() {
                                Some((_, heirs_lease)) => {
                                    state.slots.insert(slot, (heir, heirs_lease));
                                    state.line.remove(&heirs_place);
                                    Attempt::Done
                                }
                                None if self.rules == Rules::NoHeirGuard => {
                                    state.slots.insert(slot, (heir, lease));
                                    Attempt::Done
                                }
                                None => Attempt::Ending(slot),
                            }
                        }
                    }
                }
            }
            (Attempt::Leaving { lease }, _) => {
                if state.line.get(&place).is_some_and(|(_, on)| *on == lease) {
                    state.line.remove(&place);
                    Attempt::GaveUp
                } else {
                    match handed {
                        Some(slot) => Attempt::Ending(slot),
                        None => Attempt::GaveUp,
                    }
                }
            }
            (other, _) => other,
        };
    }

    fn wake(&self, state: &mut State, node: usize) {
        let old = state.nodes[node].1;
        if state.live_leases.contains(&old) {
            state.nodes[node].0 = Up::Live;
            return;
        }
        let lease = state.next_lease;
        state.next_lease += 1;
        state.live_leases.insert(lease);
        state.nodes[node] = (Up::Live, lease);
        for (attempt, on) in self.on.iter().enumerate() {
            if *on != node {
                continue;
            }
            state.attempts[attempt] = match state.attempts[attempt] {
                Attempt::Running(slot) if self.rules == Rules::RunOnAfterLapse => Attempt::Running(slot),
                // The slot lapsed with the lease: the run is killed at once.
                Attempt::Running(_) | Attempt::Ending(_) | Attempt::Releasing { .. } => Attempt::Killed,
                // Its place went with the lease: it stands in line again.
                Attempt::InLine | Attempt::Taking { .. } | Attempt::Unsure { .. } => Attempt::Idle,
                Attempt::Leaving { .. } => Attempt::GaveUp,
                other => other,
            };
        }
    }
}

const LIMIT: &str = "never more than the limit running";
const NO_LEAK: &str = "nothing left on a live lease once every attempt ended";
const ENDS: &str = "every attempt ends";

impl Model for Slots {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let leases: Vec<u8> = (0..self.nodes as u8).collect();
        vec![State {
            slots: BTreeMap::new(),
            line: BTreeMap::new(),
            live_leases: leases.iter().copied().collect(),
            nodes: leases.iter().map(|lease| (Up::Live, *lease)).collect(),
            attempts: vec![Attempt::Idle; self.on.len()],
            faults: 0,
            next_lease: self.nodes as u8,
            limit: self.limit,
            ran_before: BTreeSet::new(),
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (attempt, now) in state.attempts.iter().enumerate() {
            if state.nodes[self.on[attempt]].0 != Up::Live || now.ended() {
                continue;
            }
            match now {
                Attempt::Running(_) => actions.push(Action::Finish(attempt)),
                Attempt::InLine | Attempt::Unsure { .. } => {
                    actions.push(Action::Step(attempt));
                    actions.push(Action::GiveUp(attempt));
                }
                Attempt::Taking { .. } if state.faults < self.faults => {
                    actions.push(Action::Step(attempt));
                    actions.push(Action::LoseReply(attempt));
                }
                Attempt::Leaving { .. } if state.faults < self.faults => {
                    actions.push(Action::Step(attempt));
                    actions.push(Action::FailLeave(attempt));
                }
                _ => actions.push(Action::Step(attempt)),
            }
        }
        if self.lowered.is_some_and(|lowered| lowered < state.limit) {
            actions.push(Action::Lower);
        }
        for (node, (up, _)) in state.nodes.iter().enumerate() {
            match up {
                Up::Live if state.faults < self.faults => {
                    actions.push(Action::Crash(node));
                    actions.push(Action::Stall(node));
                }
                Up::Stalled => actions.push(Action::Wake(node)),
                _ => {}
            }
        }
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let mut next = state.clone();
        match action {
            Action::Step(attempt) => self.step(&mut next, attempt),
            Action::GiveUp(attempt) => {
                let lease = next.nodes[self.on[attempt]].1;
                next.attempts[attempt] = match next.attempts[attempt] {
                    // It never learnt that it may hold a slot: nothing to leave.
                    Attempt::Unsure { .. } if self.rules == Rules::TrustLostReplies => Attempt::GaveUp,
                    _ => Attempt::Leaving { lease },
                };
            }
            Action::Finish(attempt) => {
                if let Attempt::Running(slot) = next.attempts[attempt] {
                    next.attempts[attempt] = Attempt::Ending(slot);
                    next.ran_before.remove(&attempt);
                }
            }
            Action::LoseReply(attempt) => {
                next.faults += 1;
                if let Attempt::Taking { slot, in_line, lease } = next.attempts[attempt] {
                    self.land_take(&mut next, attempt, slot, in_line, lease);
                    next.attempts[attempt] = Attempt::Unsure { in_line };
                }
            }
            Action::FailLeave(attempt) => {
                next.faults += 1;
                if self.rules == Rules::TrustLostReplies {
                    // Left in line: "the place goes with the lease", which lives on.
                    next.attempts[attempt] = Attempt::GaveUp;
                }
                // Else it tries again: its next step.
            }
            Action::Lower => {
                next.limit = self.lowered.unwrap_or(next.limit);
                next.ran_before = next
                    .attempts
                    .iter()
                    .enumerate()
                    .filter(|(_, now)| matches!(now, Attempt::Running(_)))
                    .map(|(attempt, _)| attempt)
                    .collect();
            }
            Action::Crash(node) => {
                next.faults += 1;
                let lease = next.nodes[node].1;
                next.nodes[node].0 = Up::Crashed;
                expire(&mut next, lease);
                for (attempt, on) in self.on.iter().enumerate() {
                    if *on == node {
                        next.attempts[attempt] = Attempt::Dead;
                        next.ran_before.remove(&attempt);
                    }
                }
            }
            Action::Stall(node) => {
                next.faults += 1;
                next.nodes[node].0 = Up::Stalled;
                let lease = next.nodes[node].1;
                // Stalled past the TTL: etcd lets the lease go meanwhile.
                expire(&mut next, lease);
            }
            Action::Wake(node) => self.wake(&mut next, node),
        }
        Some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(LIMIT, |model: &Slots, state: &State| {
                let running = state
                    .attempts
                    .iter()
                    .enumerate()
                    .filter(|(attempt, now)| {
                        matches!(now, Attempt::Running(_)) && state.nodes[model.on[*attempt]].0 == Up::Live
                    })
                    .count();
                // Runs that went when the limit was lowered go on past it, but no run starts
                // beside them past it: more than the limit run only while all are theirs.
                let only_before = state.attempts.iter().enumerate().all(|(attempt, now)| {
                    !matches!(now, Attempt::Running(_))
                        || state.nodes[model.on[attempt]].0 != Up::Live
                        || state.ran_before.contains(&attempt)
                });
                running <= state.limit as usize || (only_before && running <= model.limit as usize)
            }),
            Property::always(NO_LEAK, |_: &Slots, state: &State| {
                !state.attempts.iter().all(|now| now.ended())
                    || state
                        .slots
                        .values()
                        .chain(state.line.values())
                        .all(|(_, lease)| !state.live_leases.contains(lease))
            }),
            Property::eventually(ENDS, |_: &Slots, state: &State| {
                state.attempts.iter().all(|now| now.ended())
            }),
        ]
    }
}

fn check(model: Slots) -> Vec<&'static str> {
    let checker = model
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    println!(
        "slot model {:?} (limit {}, lowered to {:?}, {} attempts on {} nodes, {} faults): {} states",
        checker.model().rules,
        checker.model().limit,
        checker.model().lowered,
        checker.model().on.len(),
        checker.model().nodes,
        checker.model().faults,
        checker.unique_state_count()
    );
    let found: Vec<&'static str> = [LIMIT, NO_LEAK, ENDS]
        .into_iter()
        .filter(|property| checker.discovery(property).is_some())
        .collect();
    for property in &found {
        if let Some(path) = checker.discovery(property) {
            println!("{property}: {:?}", path.into_actions());
        }
    }
    found
}

fn model(limit: u32, on: &[usize], faults: u8, rules: Rules) -> Slots {
    Slots {
        limit,
        lowered: None,
        nodes: on.iter().max().map_or(1, |last| last + 1),
        on: on.to_vec(),
        faults,
        rules,
    }
}

fn lowered(limit: u32, to: u32, on: &[usize], rules: Rules) -> Slots {
    Slots {
        lowered: Some(to),
        ..model(limit, on, 0, rules)
    }
}

#[test]
fn slots_hold_the_limit_leak_nothing_and_every_attempt_ends() {
    for (limit, on, faults) in [(1, vec![0, 1, 1], 1), (2, vec![0, 1, 0, 1], 1), (1, vec![0, 1], 2)] {
        assert_eq!(check(model(limit, &on, faults, Rules::Sound)), Vec::<&str>::new());
    }
}

#[test]
fn a_limit_lowered_while_slots_are_held_holds_once_their_runs_end() {
    for (limit, to, on) in [(2, 1, vec![0, 1, 0, 1]), (3, 1, vec![0, 1, 0, 1])] {
        assert_eq!(check(lowered(limit, to, &on, Rules::Sound)), Vec::<&str>::new());
    }
}

#[test]
fn the_checker_catches_each_guard_taken_away() {
    assert!(check(model(1, &[0, 1], 0, Rules::NoFreeGuard)).contains(&LIMIT));
    assert!(check(model(1, &[0, 1, 1], 0, Rules::NoHeirGuard)).contains(&NO_LEAK));
    assert!(check(model(1, &[0, 1], 1, Rules::RunOnAfterLapse)).contains(&LIMIT));
    // A lost reply to a take, or a failed call to leave the line, leaves a place (or a slot)
    // on a lease that lives on: the zombie of the review's H2.
    assert!(check(model(1, &[0, 1], 1, Rules::TrustLostReplies)).contains(&NO_LEAK));
    assert!(check(lowered(2, 1, &[0, 1, 0, 1], Rules::LimitAtTake)).contains(&LIMIT));
}
