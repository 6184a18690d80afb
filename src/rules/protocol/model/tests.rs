//! The bounded check that runs with the unit tests, and the rules broken on purpose that it
//! must catch.

use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model};

use super::properties::{
    AT_MOST_ONCE, DELIVERED, FENCES_GROW, LOST_NEVER_STARTS, NO_SILENT_LOSS, PLACED, REPEATS_FLAGGED,
};
use super::{Protocol, Rules};
use crate::rules::config::Delivery;

const PROPERTIES: [&str; 7] = [
    AT_MOST_ONCE,
    FENCES_GROW,
    REPEATS_FLAGGED,
    NO_SILENT_LOSS,
    DELIVERED,
    PLACED,
    LOST_NEVER_STARTS,
];

/// The states each check of the everyday suite generates at most: about 6 s of a 2-core
/// machine's debug build, breadth first, so every state up to the depth it prints is checked. The
/// same models run to their end before a release (`every_everyday_model_to_its_end`).
const EVERYDAY_STATES: usize = 300_000;

/// Runs the checker on `model` and prints what it explored.
fn check(name: &str, model: Protocol) -> impl Checker<Protocol> {
    check_within(name, model, limit())
}

/// Runs the checker on `model`, generating about `states` states at most, and prints what it
/// explored.
fn check_within(name: &str, model: Protocol, states: usize) -> impl Checker<Protocol> {
    let began = Instant::now();
    let checker = model.checker().threads(2).target_state_count(states).spawn_bfs().join();
    println!(
        "model {name}: {} states ({} unique), depth {}, {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        began.elapsed().as_secs_f64()
    );
    checker
}

/// Runs the checker on `model` with a rule broken until it breaks one of `expected`, and returns
/// the properties broken with their counterexamples.
fn catches(rules: Rules, mut model: Protocol, expected: &[&'static str]) -> Vec<(&'static str, String)> {
    model.rules = rules;
    let began = Instant::now();
    let checker = model
        .checker()
        .threads(2)
        .target_state_count(limit())
        .finish_when(HasDiscoveries::AnyOf(expected.iter().copied().collect()))
        .spawn_bfs()
        .join();
    let found: Vec<(&'static str, String)> = PROPERTIES
        .into_iter()
        .filter_map(|property| checker.discovery(property).map(|path| (property, super::trace(&path))))
        .collect();
    println!(
        "model {rules:?}: {} states, {:.1} s, broke: {:?}",
        checker.unique_state_count(),
        began.elapsed().as_secs_f64(),
        found.iter().map(|(property, _)| *property).collect::<Vec<_>>()
    );
    for (property, trace) in &found {
        println!("{property}:\n{trace}");
    }
    found
}

fn assert_caught(rules: Rules, model: Protocol, expected: &[&'static str]) {
    let found = catches(rules, model, expected);
    assert!(
        found.iter().any(|(property, _)| expected.contains(property)),
        "{rules:?} broke none of {expected:?}"
    );
}

/// 2 nodes, jobs `a` (at-least-once) and `b` (at-most-once), shard counts 1 and 2, time to
/// second `horizon`, at most `faults` faults.
fn fleet(jobs: usize, faults: u8, horizon: u8) -> Protocol {
    let mut model = Protocol::new(
        2,
        &[("a", Delivery::AtLeastOnce), ("b", Delivery::AtMostOnce)][..jobs],
        &[1, 2],
        faults,
    );
    model.horizon = horizon;
    model
}

/// 3 nodes, the first two with the pool's tags; job `a` (at-least-once) in the pool.
fn pool(faults: u8, horizon: u8) -> Protocol {
    let mut model =
        Protocol::new(3, &[("a", Delivery::AtLeastOnce)], &[1], faults).with_pool(&["a"], &[true, true, false]);
    model.horizon = horizon;
    model
}

/// 2 nodes, each running its instance of `c` (`fan_out = "all"`, as `delivery` says).
fn fan_out(delivery: Delivery, faults: u8, horizon: u8) -> Protocol {
    let mut model = Protocol::new(2, &[], &[1], faults).with_fan_out("c", delivery);
    model.horizon = horizon;
    model
}

/// 2 nodes with the pool's tags; job `a` (as `delivery` says) in the pool, and a restart may
/// bring the config without `run_on`, which puts `a` in the fleet's single shard.
fn rollout(delivery: Delivery, faults: u8, horizon: u8) -> Protocol {
    let mut model = Protocol::new(2, &[("a", delivery)], &[1], faults).with_pool(&["a"], &[true, true]);
    model.rollout = true;
    model.horizon = horizon;
    model
}

/// The models of the everyday suite: the claim protocol with two jobs and one fault, and with
/// one job and two; a pool, a fanned-out job and a rollout of `run_on`, one delivery each (the
/// deeper checks before a release run both, and the rollout at-least-once model also runs
/// under a broken rule below).
fn everyday_models() -> [(&'static str, Protocol); 5] {
    [
        ("bounded", fleet(2, 1, 3)),
        ("bounded two faults", fleet(1, 2, 2)),
        ("pool", pool(1, 2)),
        ("fan-out at-least-once", fan_out(Delivery::AtLeastOnce, 1, 2)),
        ("rollout at-most-once", rollout(Delivery::AtMostOnce, 2, 2)),
    ]
}

fn assert_keeps_every_property(name: &str, checker: &impl Checker<Protocol>) {
    for property in PROPERTIES {
        if let Some(path) = checker.discovery(property) {
            panic!("{name}: {property}:\n{}", super::trace(&path));
        }
    }
}

#[test]
fn the_claim_protocol_pools_fan_out_and_rollout_keep_every_property_within_the_everyday_budget() {
    for (name, model) in everyday_models() {
        let checker = check_within(name, model, limit().min(EVERYDAY_STATES));
        assert_keeps_every_property(name, &checker);
    }
}

/// The everyday models explored to their last reachable state: minutes.
#[test]
#[ignore = "minutes: run before a release (docs/benchmarks.md)"]
fn every_everyday_model_to_its_end() {
    for (name, model) in everyday_models() {
        let checker = check(name, model);
        assert_keeps_every_property(name, &checker);
    }
}

#[test]
fn the_checker_catches_a_node_without_the_tags_in_a_pools_election() {
    assert_caught(Rules::AnyNodeInPool, pool(1, 2), &[PLACED]);
}

#[test]
fn the_checker_catches_a_pool_leaders_debts_named_by_shard_count_alone() {
    assert_caught(
        Rules::FamilyByCount,
        rollout(Delivery::AtLeastOnce, 2, 2),
        &[AT_MOST_ONCE, REPEATS_FLAGGED, LOST_NEVER_STARTS],
    );
}

#[test]
fn the_checker_catches_a_claim_without_the_leadership_guard() {
    assert_caught(Rules::Unguarded, fleet(2, 2, 3), &PROPERTIES);
}

#[test]
fn the_checker_catches_a_new_term_that_forgets_the_ticks_its_leadership_owes() {
    assert_caught(Rules::ResetOwed, fleet(2, 2, 3), &PROPERTIES);
}

#[test]
fn the_checker_catches_ticks_recorded_lost_only_after_the_claim_that_drops_them() {
    assert_caught(Rules::LostAfterClaim, fleet(2, 2, 3), &[NO_SILENT_LOSS]);
}

/// The deeper check before a release, sized by `SHARDCRON_MODEL_*` variables (NODES, JOBS,
/// FAULTS, HORIZON, SKEW, TTL; STATES caps the states explored), and every rule broken on
/// purpose: `cargo test --release --lib rules::protocol::model -- --ignored --nocapture`.
#[test]
#[ignore = "minutes: run before a release (docs/benchmarks.md)"]
fn the_deeper_check_before_a_release() {
    let knob = |name: &str, default: u8| {
        std::env::var(format!("SHARDCRON_MODEL_{name}"))
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    let jobs = [
        ("a", Delivery::AtLeastOnce),
        ("b", Delivery::AtMostOnce),
        ("c", Delivery::AtLeastOnce),
    ];
    let mut model = Protocol::new(
        usize::from(knob("NODES", 2)),
        &jobs[..usize::from(knob("JOBS", 2)).clamp(1, 3)],
        &[1, 2],
        knob("FAULTS", 2),
    );
    model.horizon = knob("HORIZON", 3);
    model.skew = knob("SKEW", 0);
    model.ttl = knob("TTL", 2);
    model.concurrent_starts = knob("CONCURRENT_STARTS", 0) == 1;
    let checker = check("deep", model);
    assert_keeps_every_property("deep", &checker);
}

/// Where jobs run, deeper: the pool with 2 faults, each delivery mode fanned out to a 3 s
/// horizon (with 2 faults it outgrows the machine's memory) and in a rollout with 2 faults.
/// `SHARDCRON_MODEL_WHERE` picks some of them by name (comma-separated); all by default.
#[test]
#[ignore = "minutes: run before a release (docs/benchmarks.md)"]
fn the_deeper_checks_of_where_jobs_run() {
    let wanted = std::env::var("SHARDCRON_MODEL_WHERE").unwrap_or_default();
    let models = [
        ("pool", pool(2, 2)),
        ("fan-out-at-least-once", fan_out(Delivery::AtLeastOnce, 1, 3)),
        ("fan-out-at-most-once", fan_out(Delivery::AtMostOnce, 1, 3)),
        ("rollout-at-least-once", rollout(Delivery::AtLeastOnce, 2, 3)),
        ("rollout-at-most-once", rollout(Delivery::AtMostOnce, 2, 3)),
    ];
    for (name, model) in models {
        if !wanted.is_empty() && !wanted.split(',').any(|one| one == name) {
            continue;
        }
        let checker = check(name, model);
        assert_keeps_every_property(name, &checker);
    }
}

#[test]
#[ignore = "minutes: run before a release (docs/benchmarks.md)"]
fn every_rule_broken_on_purpose_is_caught() {
    let cases = [
        (Rules::BeforeIssue27, fleet(2, 2, 3), &[NO_SILENT_LOSS, DELIVERED][..]),
        (Rules::Unguarded, fleet(2, 2, 3), &PROPERTIES[..]),
        (Rules::ResetOwed, fleet(2, 2, 3), &PROPERTIES[..]),
        (Rules::LostAfterClaim, fleet(2, 2, 3), &[NO_SILENT_LOSS][..]),
        (Rules::DropSettlesOnChange, fleet(1, 2, 2), &[DELIVERED][..]),
        (Rules::ReleaseAdopted, fleet(2, 2, 3), &[REPEATS_FLAGGED][..]),
        (Rules::SkipGap, fleet(1, 2, 3), &[DELIVERED][..]),
        (Rules::AnyNodeInPool, pool(1, 2), &[PLACED][..]),
        (
            Rules::FamilyByCount,
            rollout(Delivery::AtLeastOnce, 2, 2),
            &[AT_MOST_ONCE, REPEATS_FLAGGED, LOST_NEVER_STARTS][..],
        ),
    ];
    for (rules, model, expected) in cases {
        assert_caught(rules, model, expected);
    }
}

fn limit() -> usize {
    std::env::var("SHARDCRON_MODEL_STATES")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(usize::MAX)
}
