//! status, the API and the dashboard over 100,000 jobs that have run.

use crate::common::*;

/// `jobs` jobs that have all run once (a claim and a result each, written into etcd as a
/// leader would): `status --json` time and peak memory, the node's status and jobs answers, and
/// the dashboard's first page in a browser.
pub(crate) fn bench_read_path(jobs: usize) {
    let mut world = World::new();
    let path = world.dir.path().join("jobs.toml");
    write_jobs_file(&path, jobs, &YEARLY);
    let url = world.etcd.client_url();
    let seeded_mib = seed_run_records(&url, jobs);
    let mut times = Vec::new();
    let mut peaks = Vec::new();
    let mut out_mib = 0.0;
    for _ in 0..3 {
        let out = world.dir.path().join("status.json");
        let file = std::fs::File::create(&out).expect("status output");
        let (time, peak, ok) = run_measured(
            Command::new(SHARDCRON)
                .args(["status", "--json", "--endpoints", &url, "--config"])
                .arg(&path)
                .stdout(file)
                .stderr(Stdio::null()),
        );
        assert!(ok, "status --json failed");
        out_mib = std::fs::metadata(&out).map_or(0, |meta| meta.len()) as f64 / (1024.0 * 1024.0);
        times.push(time);
        peaks.push(peak);
    }
    let port = shardcron::etcd_server::free_port().expect("port");
    world
        .node("a", &path)
        .args(&["--endpoints", &url, "--http-addr", &port.to_string()])
        .start();
    wait_ready_within(port, Duration::from_secs(300));
    let timed = |path: &str| {
        let started = Instant::now();
        let response = http_request(port, "GET", path, &[], "");
        assert_eq!(response.status, 200, "{path}: {}", response.status_line);
        (
            started.elapsed().as_secs_f64(),
            response.body.len() as f64 / (1024.0 * 1024.0),
        )
    };
    let (api_status, api_status_mib) = timed("/api/v1/status");
    // Past the status cache's second: a read of its own.
    std::thread::sleep(Duration::from_millis(1100));
    let (api_jobs, _) = timed("/api/v1/jobs?per_page=100");
    let (api_filtered, _) = timed("/api/v1/jobs?per_page=100&filter=job-0999");
    let browser = crate::support::browser::Browser::start(1400, 1000);
    let mut loads = Vec::new();
    for _ in 0..3 {
        browser.open("about:blank");
        let started = Instant::now();
        browser.open(&format!("http://127.0.0.1:{port}/"));
        browser.wait_for_element("[data-job=\"job-000000\"]", Duration::from_secs(60));
        loads.push(started.elapsed().as_secs_f64());
    }
    println!("\n### The read path at {jobs} jobs that have all run once ({seeded_mib:.0} MiB of records in etcd)\n");
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!(
        "| `status --json`, median of 3 ({out_mib:.0} MiB printed) | {:.2} s | ≤ 2 s |",
        median(&mut times)
    );
    println!(
        "| `status --json` peak resident memory, most of 3 | {:.0} MiB | ≤ 100 MB |",
        peaks.iter().copied().fold(0.0, f64::max)
    );
    println!(
        "| `GET /api/v1/status` ({api_status_mib:.0} MiB) | {} | |",
        ms(api_status)
    );
    println!("| `GET /api/v1/jobs?per_page=100` | {} | |", ms(api_jobs));
    println!(
        "| `GET /api/v1/jobs?per_page=100&filter=job-0999` | {} | |",
        ms(api_filtered)
    );
    println!(
        "| dashboard: open to first job row shown, median of 3 (headless chromium) | {} | ≤ 2 s |",
        ms(median(&mut loads))
    );
    println!(
        "| node peak resident memory | {:.0} MiB | |",
        world.nodes[0].peak_rss_mib()
    );
}
/// Writes a claim and a result for each of `jobs` generated jobs into the etcd at `url`, both
/// newer than any of their yearly ticks (so no node catches one up); returns the MiB written.
pub(crate) fn seed_run_records(url: &str, jobs: usize) -> f64 {
    use shardcron::rules::record::{Claim, Outcome, RunRecord, Trigger};
    let now = Utc::now();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let client = etcd_client::Client::connect([url], None).await.expect("etcd");
        let mut written = 0;
        let names: Vec<String> = (0..jobs).map(|i| format!("job-{i:06}")).collect();
        for chunk in names.chunks(60) {
            let mut puts = Vec::new();
            for name in chunk {
                let claim = Claim {
                    scheduled_at: now,
                    term: 1,
                    node: "bench-node".to_string(),
                    ..Claim::default()
                };
                let run = RunRecord {
                    scheduled_at: now,
                    fence: 1,
                    node: "bench-node".to_string(),
                    outcome: Outcome::Exited,
                    exit_code: Some(0),
                    duration_ms: 12,
                    finished_at: now,
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
                puts.push(etcd_client::TxnOp::put(
                    format!("/shardcron/bench/jobs/{name}/last"),
                    claim,
                    None,
                ));
                puts.push(etcd_client::TxnOp::put(
                    format!("/shardcron/bench/jobs/{name}/result"),
                    run,
                    None,
                ));
            }
            client
                .clone()
                .txn(etcd_client::Txn::new().and_then(puts))
                .await
                .expect("seed records");
        }
        written as f64 / (1024.0 * 1024.0)
    })
}
