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

/// `shardcron ARGS --config CONFIG`: its stdout, stderr and exit code.
fn cli(config: &std::path::Path, args: &[&str]) -> (String, String, Option<i32>) {
    let output = shardcron(config, args);
    (
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
        output.status.code(),
    )
}

/// Bytes etcd has sent its gRPC clients so far, from its own metrics.
fn etcd_sent_bytes(world: &World) -> f64 {
    let url = world.etcd.client_url();
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("etcd port");
    let page = http_exchange(
        port,
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        std::time::Duration::from_secs(10),
    )
    .expect("etcd's metrics");
    sample(&page.body, "etcd_network_client_grpc_sent_bytes_total").expect("etcd's sent bytes")
}

/// A history entry as the previous release wrote it: the output tails inside the entry.
fn seed_old_history(world: &World, job: &str, entries: i64, tail: usize) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = Client::connect([world.etcd.client_url()], None).await.expect("etcd");
        for index in 0..entries {
            let at = tick() - chrono::Duration::days(entries - index);
            let run = RunRecord {
                output: Some(shardcron::rules::record::RunOutput {
                    stdout: "o".repeat(tail),
                    stderr: "e".repeat(tail),
                    stdout_truncated: true,
                    stderr_truncated: true,
                }),
                ..RunRecord {
                    scheduled_at: at,
                    fence: index + 1,
                    node: "old".to_string(),
                    outcome: Outcome::Exited,
                    exit_code: Some(0),
                    duration_ms: 1,
                    finished_at: at,
                    attempts: 1,
                    trigger: Trigger::Schedule,
                    output: None,
                    blackout: None,
                }
            };
            let key = format!("/shardcron/test/runs/{job}/{:012}", at.timestamp());
            client
                .clone()
                .put(key, serde_json::to_vec(&run).expect("run"), None)
                .await
                .expect("seed an entry");
        }
    });
}

/// Runs that keep 64 KiB tails of both streams, and a history of 100 such entries: `history
/// -n 100` and the API read them in pages under etcd-client's 4 MiB limit, and a read
/// without output does not pull the tails out of etcd.
#[test]
fn histories_of_big_outputs_are_read_in_pages_and_without_their_tails() {
    let mut world = World::new();
    let loud = "head -c 70000 /dev/zero | tr \"\\\\0\" x; head -c 70000 /dev/zero | tr \"\\\\0\" y >&2";
    let config = world.write_config_tables(
        "jobs.toml",
        1,
        2,
        &[
            (
                "loud",
                format!("schedule = \"* * * * * *\"\ncommand = '{loud}'\noutput_tail = \"64KiB\""),
            ),
            (
                "old",
                "schedule = \"0 3 * * *\"\ncommand = 'true'\noutput_tail = \"64KiB\"".to_string(),
            ),
        ],
    );
    let text = std::fs::read_to_string(&config).expect("config");
    std::fs::write(&config, text.replacen("[cluster]\n", "[cluster]\nhistory = 200\n", 1)).expect("config");
    seed_old_history(&world, "old", 100, 64 * 1024);
    let port = world.node("a", &config).start_serving();

    step("100 entries of the previous release's shape, 128 KiB each: history -n 100 and the API");
    let (stdout, stderr, code) = cli(&config, &["history", "old", "-n", "100"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 101, "a header and 100 runs: {stderr}");
    let answer = http_request(port, "GET", "/api/v1/jobs/old/history?count=100", &[], "");
    assert_eq!(
        answer.status,
        200,
        "{}",
        answer.body.chars().take(300).collect::<String>()
    );
    assert_eq!(answer.json().as_array().map(Vec::len), Some(100));

    step("a run of loud keeps 2 x 64 KiB of output; 6 of them, then the job is paused");
    wait_for(
        std::time::Duration::from_secs(60),
        "6 runs of loud in its history",
        || {
            let answer = http_request(port, "GET", "/api/v1/jobs/loud/history?count=100", &[], "");
            answer.status == 200
                && answer
                    .json()
                    .as_array()
                    .is_some_and(|runs| runs.iter().filter(|run| run["outcome"] == "exited").count() >= 6)
        },
    );
    let (_, stderr, code) = cli(&config, &["pause", "loud"]);
    assert_eq!(code, Some(0), "{stderr}");
    let (with_output, stderr, code) = cli(&config, &["history", "loud", "-n", "3", "--output"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        with_output.contains(&"x".repeat(1000)),
        "history --output shows the kept output"
    );
    let run = http_request(port, "GET", "/api/v1/jobs/loud/history?count=100&output=true", &[], "");
    assert_eq!(run.status, 200, "{}", run.body.chars().take(300).collect::<String>());

    step("history -n 100 without output: etcd sends no tails");
    let before = etcd_sent_bytes(&world);
    let (table, stderr, code) = cli(&config, &["history", "loud", "-n", "100"]);
    let sent = etcd_sent_bytes(&world) - before;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(table.lines().count() > 6, "{table}");
    eprintln!("etcd sent {sent} bytes for history -n 100 of loud without output");
    assert!(
        sent < 256.0 * 1024.0,
        "a history read without output pulled {sent} bytes: the tails"
    );
}
