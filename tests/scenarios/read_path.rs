//! The read path past etcd-client's 4 MiB answer limit: `status`, `/api/v1/status` and
//! `/api/v1/jobs` read job records in pages and still answer, correctly.

use chrono::{DateTime, Datelike, TimeZone, Utc};
use etcd_client::{Client, Txn, TxnOp};
use shardcron::rules::record::{Claim, Outcome, RunRecord, Trigger};
use shardcron::serving::status::Status;

use crate::support::*;

const JOBS: usize = 6_000;

/// A node id long enough that `JOBS` jobs' records pass 4 MiB.
fn node_of(index: usize) -> String {
    format!("node-{index:05}-{}", "x".repeat(300))
}

/// The newest tick of the yearly jobs: with it claimed, a node has no tick to catch up.
fn tick() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(Utc::now().year(), 1, 1, 0, 0, 0)
        .single()
        .expect("instant")
}

/// Writes each job's claim and result into etcd as a leader would have, and returns the bytes
/// written.
fn seed(world: &World, names: &[String]) -> usize {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = Client::connect([world.etcd.client_url()], None).await.expect("etcd");
        let mut written = 0;
        for (chunk_index, chunk) in names.chunks(50).enumerate() {
            let mut puts = Vec::new();
            for (offset, name) in chunk.iter().enumerate() {
                let index = chunk_index * 50 + offset;
                let claim = Claim {
                    scheduled_at: tick(),
                    term: index as i64 + 1,
                    node: node_of(index),
                    ..Claim::default()
                };
                let run = RunRecord {
                    scheduled_at: tick(),
                    fence: index as i64 + 1,
                    node: node_of(index),
                    outcome: Outcome::Exited,
                    exit_code: Some((index % 7) as i32),
                    duration_ms: index as u64,
                    finished_at: tick(),
                    attempts: 1,
                    trigger: Trigger::Schedule,
                    output: None,
                    blackout: None,
                };
                let (claim, run) = (
                    serde_json::to_string(&claim).expect("claim"),
                    serde_json::to_string(&run).expect("run"),
                );
                written += claim.len() + run.len();
                puts.push(TxnOp::put(format!("/shardcron/test/jobs/{name}/last"), claim, None));
                puts.push(TxnOp::put(format!("/shardcron/test/jobs/{name}/result"), run, None));
            }
            client
                .clone()
                .txn(Txn::new().and_then(puts))
                .await
                .expect("seed records");
        }
        written
    })
}

fn assert_records(status: &Status, names: &[String], source: &str) {
    assert_eq!(status.jobs.len(), names.len(), "{source}: every job");
    for (index, job) in status.jobs.iter().enumerate() {
        assert_eq!(job.name, names[index], "{source}: sorted by name");
        let run = job
            .last_run
            .as_ref()
            .unwrap_or_else(|| panic!("{source}: {} has its last run", job.name));
        assert_eq!(run.node, node_of(index), "{source}: {}", job.name);
        assert_eq!(run.exit_code, Some((index % 7) as i32), "{source}: {}", job.name);
        let claim = job.last_claim.as_ref().expect("last claim");
        assert_eq!(claim.term, index as i64 + 1, "{source}: {}", job.name);
    }
}

#[test]
fn status_reads_more_than_4_mib_of_job_records() {
    let mut world = World::new();
    let names = job_names(JOBS, 5);
    // Yearly: none of them fires while the test runs, so the seeded records stay the last.
    let jobs: Vec<(&str, &str, &str)> = names.iter().map(|name| (name.as_str(), "0 0 1 1 *", "")).collect();
    let config = world.write_config("jobs.toml", 4, 2, &jobs);
    let written = seed(&world, &names);
    eprintln!("{written} bytes of job records in etcd");
    assert!(written > 4 * 1024 * 1024, "more than 4 MiB of records: {written}");

    step("status --json");
    let status = world.status(&config);
    assert_records(&status, &names, "status --json");

    step("/api/v1/status and /api/v1/jobs of a node");
    let port = world.node("a", &config).start_serving();
    let answer = http_request(port, "GET", "/api/v1/status", &[], "");
    assert_eq!(
        answer.status,
        200,
        "{}",
        answer.body.chars().take(500).collect::<String>()
    );
    let status: Status = serde_json::from_str(&answer.body).expect("status JSON");
    assert_records(&status, &names, "/api/v1/status");

    let page = http_request(port, "GET", "/api/v1/jobs?filter=JOB0012&page=2&per_page=3", &[], "").json();
    assert_eq!(page["matched"], 10, "job00120 to job00129: {page}");
    assert_eq!(page["total"], JOBS, "{page}");
    let shown: Vec<&str> = page["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|job| job["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(shown, ["job00123", "job00124", "job00125"], "{page}");
    assert_eq!(page["jobs"][0]["last_run"]["node"], node_of(123), "{page}");
    assert_eq!(
        http_request(port, "GET", "/api/v1/jobs?per_page=100000", &[], "").status,
        400,
        "per_page is bounded"
    );
}
