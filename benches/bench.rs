//! shardcron's benchmarks. Each section starts its own etcd and nodes on loopback and prints a
//! markdown table; none asserts, the figures are for reading beside their targets and floors.
//! Each section is a module of its own in `benches/sections/`; `common` holds what they share.
//!
//! ```text
//! cargo bench --bench bench -- all          # every section
//! cargo bench --bench bench -- check        # check over a generated 100,000-job file
//! cargo bench --bench bench -- lateness     # firing lateness vs. direct spawn, and the sustained ceiling
//! cargo bench --bench bench -- bursts       # only the bursts: 1, 20, 200, 2,000 due at once
//!                                           # (SHARDCRON_BENCH_BURSTS=200,2000 picks the sizes)
//! cargo bench --bench bench -- failover     # SIGKILL / SIGSTOP / SIGTERM of a leader
//! cargo bench --bench bench -- etcd-cost    # etcd writes per run, per delivery mode
//! cargo bench --bench bench -- kills        # ticks lost and doubled per 100 SIGKILLs around ticks
//! cargo bench --bench bench -- scale        # the idle section, and the shards section
//! cargo bench --bench bench -- idle         # 100,000 and 1,000,000 jobs on an idle node
//! cargo bench --bench bench -- shards       # 1,024 and 4,096 shards over 3 and 10 nodes, a rolling restart
//! cargo bench --bench bench -- catch-up     # 100,000 per-minute jobs taking over records 2 h old
//!                                           # (watched 120 s; SHARDCRON_BENCH_CATCH_UP_SECS=N for longer)
//! cargo bench --bench bench -- drain        # 10,000 per-minute jobs owing 100 ticks each, watched
//!                                           # until every one ran (SHARDCRON_BENCH_DRAIN_JOBS=N)
//! cargo bench --bench bench -- timeline     # a chaos run drawn as benches/timeline.svg
//! cargo bench --bench bench -- clients      # 1,000 idle and slow-header clients for 30 s beside 20 per-second jobs
//! cargo bench --bench bench -- plan-memory  # 100 concurrent plan?for=100y: the node's memory growth
//! cargo bench --bench bench -- pools        # 16 pools × 64 shards over 10 tagged nodes
//! cargo bench --bench bench -- fan-out      # fan_out = "all": 100 and 10 per-second jobs on each of 10 nodes
//! cargo bench --bench bench -- read-path    # status, the API and the dashboard at 100,000 jobs that have run
//! cargo bench --bench bench -- groups       # 1,000 jobs of a group of 50 due at one instant over 3 nodes
//! ```

// The benchmarks use a subset of the test harness.
#[allow(dead_code, unused_imports, unused_macros)]
#[path = "../tests/support/mod.rs"]
mod support;

#[path = "sections/catch_up.rs"]
mod catch_up;
#[path = "sections/check.rs"]
mod check;
#[path = "sections/clients.rs"]
mod clients;
#[path = "sections/common.rs"]
mod common;
#[path = "sections/drain.rs"]
mod drain;
#[path = "sections/etcd_cost.rs"]
mod etcd_cost;
#[path = "sections/failover.rs"]
mod failover;
#[path = "sections/groups.rs"]
mod groups;
#[path = "sections/kills.rs"]
mod kills;
#[path = "sections/lateness.rs"]
mod lateness;
#[path = "sections/plan_memory.rs"]
mod plan_memory;
#[path = "sections/pools.rs"]
mod pools;
#[path = "sections/read_path.rs"]
mod read_path;
#[path = "sections/scale.rs"]
mod scale;
#[path = "sections/timeline.rs"]
mod timeline;

use std::path::Path;
use std::time::Duration;

use common::number_from_env;

fn main() {
    // The benchmarks inject faults to measure them, on the packaged etcd: run as a scenario of
    // that etcd, which the harness lets inject them (tests/support/etcds.rs).
    support::etcds::run_on(support::etcds::Etcd::Packaged, sections);
}

fn sections() {
    let what: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with("--")).collect();
    let wants = |name: &str| what.is_empty() || what.iter().any(|w| w == "all" || w == name);
    if wants("check") {
        check::bench_check(100_000, 5, "≤ 0.5 s", "≤ 100 MB");
        check::bench_check(1_000_000, 1, "≤ 5 s", "");
    }
    if wants("lateness") || wants("bursts") {
        lateness::bench_bursts(&lateness::burst_sizes());
    }
    if wants("lateness") {
        lateness::bench_ceiling();
    }
    if wants("failover") {
        failover::bench_failover();
    }
    if wants("etcd-cost") {
        etcd_cost::bench_etcd_cost();
    }
    if wants("kills") {
        kills::bench_kills(number_from_env("SHARDCRON_BENCH_KILLS", 100));
    }
    if wants("scale") || wants("idle") {
        scale::bench_idle_node(100_000);
        scale::bench_idle_node(1_000_000);
    }
    if wants("catch-up") {
        let watch = number_from_env("SHARDCRON_BENCH_CATCH_UP_SECS", 120);
        catch_up::bench_catch_up(100_000, 2, Duration::from_secs(watch as u64));
    }
    if wants("drain") {
        drain::bench_drain(number_from_env("SHARDCRON_BENCH_DRAIN_JOBS", 10_000));
    }
    if wants("scale") || wants("shards") {
        scale::bench_many_shards(1024, 3);
        scale::bench_many_shards(4096, 3);
        scale::bench_many_shards(4096, 10);
    }
    if wants("clients") {
        clients::bench_clients(1_000, 30);
    }
    if wants("plan-memory") {
        plan_memory::bench_plan_memory(100);
    }
    if wants("pools") {
        pools::bench_pools(16, 64, 10);
    }
    if wants("fan-out") {
        // The size asked for, then one this 2-core machine keeps up with.
        for jobs in [100, 10] {
            pools::bench_fan_out(10, jobs);
        }
    }
    if wants("groups") {
        groups::bench_groups(1_000, 50, 3, 0.5, 10);
    }
    if wants("read-path") {
        read_path::bench_read_path(100_000);
    }
    if wants("timeline") {
        timeline::bench_timeline(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("benches/timeline.svg")
                .as_path(),
        );
    }
}
