//! The HTTP listener against a real etcd: probes, the JSON API's shapes and status codes, its
//! write token, the per-job gauges across a failover, and systemd's notify protocol.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

use serde_json::Value;
use shardcron::serving::status::Status;

use crate::support::*;

const TOKEN_VAR: &str = "SHARDCRON_TEST_API_TOKEN";
const TOKEN: &str = "correct horse battery staple";

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn post(port: u16, path: &str, token: Option<&str>, body: &str) -> HttpResponse {
    match token {
        Some(token) => http_request(port, "POST", path, &[("Authorization", &bearer(token))], body),
        None => http_request(port, "POST", path, &[], body),
    }
}

fn error_of(response: &HttpResponse) -> String {
    response.json()["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error message: {}", response.body))
        .to_string()
}

#[test]
fn the_api_reads_like_the_cli_and_guards_its_writes() {
    let mut world = World::new();
    let config = world.write_config(
        "jobs.toml",
        2,
        2,
        &[
            ("tick", EVERY_SECOND, ""),
            // Only ever runs when asked: its last run is the requested one.
            ("yearly", "0 0 1 1 *", ""),
        ],
    );
    let (writer, reader) = (
        shardcron::etcd_server::free_port().expect("port"),
        shardcron::etcd_server::free_port().expect("port"),
    );
    world
        .node("a", &config)
        .args(&["--http-addr", &writer.to_string(), "--api-token-env", TOKEN_VAR])
        .env(&[(TOKEN_VAR, TOKEN)])
        .start();
    // The older flag name still serves, and without --api-token-env writes are off.
    world
        .node("b", &config)
        .args(&["--metrics-addr", &format!("127.0.0.1:{reader}")])
        .start();
    wait_ready(writer);
    wait_ready(reader);

    step("probes and the plain endpoints");
    assert_eq!(
        http_get(writer, "/healthz"),
        ("HTTP/1.1 200 OK".to_string(), "ok\n".to_string())
    );
    let page = http_request(writer, "GET", "/", &[], "");
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(page.body.contains("dashboard.js"), "the dashboard loads its script");
    let script = http_request(writer, "GET", "/dashboard.js", &[], "");
    assert!(script.body.contains("api/v1/status"), "the dashboard reads the API");
    assert_eq!(http_request(writer, "HEAD", "/metrics", &[], "").status, 200);
    assert_eq!(http_request(writer, "DELETE", "/healthz", &[], "").status, 405);
    let missing = http_get(writer, "/nothing-here");
    assert!(missing.0.contains(" 404 "), "{missing:?}");
    let job_page = http_request(writer, "GET", "/jobs/tick", &[], "");
    assert_eq!(job_page.status, 200);
    assert!(job_page.body.contains("job.js"), "the job page loads its script");
    let no_job = http_request(writer, "GET", "/jobs/nope", &[], "");
    assert_eq!(no_job.status, 404, "a job the config does not have");
    assert!(no_job.body.contains("No such job"), "{}", no_job.body);

    step("reads: status, plan, history");
    let status: Status = serde_json::from_str(&http_get(writer, "/api/v1/status").1).expect("status JSON");
    assert_eq!(status.shard_count, 2);
    let names: Vec<&str> = status.jobs.iter().map(|job| job.name.as_str()).collect();
    assert_eq!(names, ["tick", "yearly"]);
    let node_ids: Vec<&str> = status.nodes.iter().map(|node| node.id.as_str()).collect();
    assert_eq!(node_ids, ["a", "b"]);
    assert_eq!(status.jobs[0].schedule, EVERY_SECOND);
    let without_jobs = http_request(writer, "GET", "/api/v1/status?jobs=false", &[], "").json();
    assert!(
        without_jobs.get("jobs").is_none() && without_jobs["nodes"].is_array(),
        "jobs=false leaves the jobs out: {without_jobs}"
    );
    let from_reader: Status = serde_json::from_str(&http_get(reader, "/api/v1/status").1).expect("status JSON");
    assert_eq!(
        from_reader.digest, status.digest,
        "every node answers for the same cluster"
    );

    let plan = http_request(writer, "GET", "/api/v1/plan?for=10s&job=tick", &[], "").json();
    let fires = plan["fires"].as_array().expect("fires");
    assert!(
        (9..=11).contains(&fires.len()),
        "a per-second job fires about 10 times in 10 s: {plan}"
    );
    for key in ["at", "at_utc", "job", "shard", "zone", "note"] {
        assert!(fires[0].get(key).is_some(), "plan lines have {key}: {}", fires[0]);
    }
    assert_eq!(plan["cut"], Value::Bool(false));
    let bad_plan = http_request(writer, "GET", "/api/v1/plan?for=banana", &[], "");
    assert_eq!(bad_plan.status, 400);
    assert!(error_of(&bad_plan).contains("banana"), "{}", bad_plan.body);
    assert_eq!(
        http_request(writer, "GET", "/api/v1/plan?job=nope", &[], "").status,
        404
    );

    wait_for(Duration::from_secs(20), "tick has a history", || {
        http_request(writer, "GET", "/api/v1/jobs/tick/history?count=3", &[], "")
            .json()
            .as_array()
            .is_some_and(|runs| runs.len() == 3)
    });
    let history = http_request(writer, "GET", "/api/v1/jobs/tick/history?count=3", &[], "").json();
    for key in [
        "scheduled_at",
        "fence",
        "node",
        "outcome",
        "exit_code",
        "duration_ms",
        "finished_at",
        "trigger",
    ] {
        assert!(
            history[0].get(key).is_some(),
            "history records have {key}: {}",
            history[0]
        );
    }
    assert_eq!(
        http_request(writer, "GET", "/api/v1/jobs/nope/history", &[], "").status,
        404
    );

    step("writes need the token");
    let no_token = post(writer, "/api/v1/jobs/yearly/trigger", None, "");
    assert_eq!(no_token.status, 401, "{}", no_token.body);
    assert_eq!(no_token.header("www-authenticate"), Some("Bearer"));
    let wrong = post(writer, "/api/v1/jobs/yearly/trigger", Some("guess"), "");
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    let off = post(reader, "/api/v1/jobs/yearly/trigger", Some(TOKEN), "");
    assert_eq!(off.status, 403, "{}", off.body);
    assert!(error_of(&off).contains("--api-token-env"), "{}", off.body);
    assert_eq!(post(writer, "/api/v1/jobs/nope/trigger", Some(TOKEN), "").status, 404);
    assert_eq!(
        post(writer, "/api/v1/jobs/yearly/trigger", Some(TOKEN), "{\"bogus\": 1}").status,
        400
    );

    step("trigger");
    let triggered = post(writer, "/api/v1/jobs/yearly/trigger", Some(TOKEN), "");
    assert_eq!(triggered.status, 202, "{}", triggered.body);
    let taken = triggered.json();
    assert_eq!(taken["job"], "yearly");
    assert!(
        ["a", "b"].contains(&taken["node"].as_str().unwrap_or_default()),
        "{taken}"
    );
    assert!(taken["fence"].as_i64().is_some_and(|fence| fence > 0), "{taken}");
    wait_for(Duration::from_secs(20), "the requested run is in the history", || {
        let runs = http_request(writer, "GET", "/api/v1/jobs/yearly/history", &[], "").json();
        runs.as_array().is_some_and(|runs| {
            runs.iter()
                .any(|run| run["trigger"] == "manual" && run["fence"] == taken["fence"])
        })
    });
    let waited = post(
        writer,
        "/api/v1/jobs/yearly/trigger",
        Some(TOKEN),
        "{\"wait\": true, \"timeout\": \"10s\"}",
    );
    assert_eq!(waited.status, 200, "{}", waited.body);
    assert_eq!(waited.json()["run"]["outcome"], "exited", "{}", waited.body);
    assert_eq!(waited.json()["run"]["exit_code"], 0, "{}", waited.body);

    step("pause and resume");
    let refused = post(
        writer,
        "/api/v1/jobs/tick/pause",
        Some(TOKEN),
        "{\"until\": \"2000-01-01T00:00:00Z\"}",
    );
    assert_eq!(refused.status, 400, "{}", refused.body);
    let paused = post(
        writer,
        "/api/v1/jobs/tick/pause",
        Some(TOKEN),
        "{\"for\": \"1h\", \"reason\": \"api test\"}",
    );
    assert_eq!(paused.status, 200, "{}", paused.body);
    assert_eq!(paused.json()["paused"]["reason"], "api test");
    let status: Status = serde_json::from_str(&http_get(reader, "/api/v1/status").1).expect("status JSON");
    let pause = status.jobs[0].paused.as_ref().expect("tick shows its pause");
    assert_eq!(pause.reason.as_deref(), Some("api test"));
    assert!(pause.until.is_some());
    let resumed = post(writer, "/api/v1/jobs/tick/resume", Some(TOKEN), "");
    assert_eq!(resumed.json(), serde_json::json!({"job": "tick", "resumed": true}));
    let again = post(writer, "/api/v1/jobs/tick/resume", Some(TOKEN), "");
    assert_eq!(again.json(), serde_json::json!({"job": "tick", "resumed": false}));
    assert_eq!(post(writer, "/api/v1/jobs/nope/resume", Some(TOKEN), "").status, 404);

    step("metrics");
    let page = http_get(writer, "/metrics").1;
    assert!(page.contains("shardcron_build_info{version=\""), "{page}");
    assert!(page.contains(",tzdb=\""), "{page}");
    for name in [
        "shardcron_runs_in_flight",
        "shardcron_shards_without_leader",
        "shardcron_config_drift_nodes",
    ] {
        assert!(sample(&page, name).is_some(), "{name} missing:\n{page}");
    }
    assert_eq!(sample(&page, "shardcron_shards_without_leader"), Some(0.0));
    // Every metric the shipped alerts and Grafana dashboard use is one a node exports. A family
    // with labels shows up with its first sample; these have had none on this node.
    let first_sample_pending = [
        "shardcron_retries_total",
        "shardcron_triggered_runs_total",
        "shardcron_blackout_skips_total",
    ];
    let missing: Vec<&str> = super::observability::KNOWN_METRICS
        .iter()
        .copied()
        .filter(|name| !first_sample_pending.contains(name))
        .filter(|name| !page.contains(&format!("# TYPE {} ", name.strip_suffix("_total").unwrap_or(name))))
        .collect();
    assert!(
        missing.is_empty(),
        "used by examples/prometheus or examples/grafana but not exported: {missing:?}\n{page}"
    );
}

on_both_etcds! {
    /// The per-job gauges come from the shard's leader only, and a new leader continues the last
    /// success from etcd even when every run it makes fails.
    fn the_last_success_gauge_survives_a_failover() {
        let mut world = World::new();
        let switch = world.dir.path().join("succeed");
        std::fs::write(&switch, "").expect("switch");
        let command = format!("test -e {}", switch.display());
        let config = world.write_config_running("jobs.toml", 1, 1, &[("flaky", EVERY_SECOND, "")], &command);
        let ports = [
            shardcron::etcd_server::free_port().expect("port"),
            shardcron::etcd_server::free_port().expect("port"),
        ];
        for (id, port) in ["a", "b"].iter().zip(ports) {
            world
                .node(id, &config)
                .args(&["--http-addr", &port.to_string()])
                .start();
            wait_ready(port);
        }
        let gauge = |port: u16, name: &str| sample(&http_get(port, "/metrics").1, &format!("{name}{{job=\"flaky\"}}"));
        let leader = || world.leader_of(&config, 0).map(|(node, _)| node);
        wait_for(Duration::from_secs(20), "the leader exports a last success", || {
            leader().is_some_and(|node| {
                let port = ports[usize::from(node == "b")];
                gauge(port, "shardcron_job_last_success_timestamp_seconds").is_some()
            })
        });
        let first = leader().expect("a leader");
        let (first_port, other_port) = if first == "a" {
            (ports[0], ports[1])
        } else {
            (ports[1], ports[0])
        };
        assert_eq!(
            gauge(other_port, "shardcron_job_last_success_timestamp_seconds"),
            None,
            "only the leader exports a job's gauges"
        );
        let interval = gauge(first_port, "shardcron_job_interval_seconds");
        assert_eq!(interval, Some(1.0));
        let next = gauge(first_port, "shardcron_job_next_run_timestamp_seconds").expect("next run");
        assert!(
            (next - now_secs()).abs() < 5.0,
            "the next run is about now: {next} vs {}",
            now_secs()
        );

        std::fs::remove_file(&switch).expect("from now on every run fails");
        wait_for(Duration::from_secs(10), "a run failed", || {
            sample(
                &http_get(first_port, "/metrics").1,
                "shardcron_runs_total{job=\"flaky\",result=\"failure\"}",
            )
            .is_some()
        });
        // A result reaches etcd with a claim, up to 1.5 s after its run: a SIGKILL before then loses
        // it, and the next leader rightly continues from the success before. Kill once the leader's
        // last success is there (read again each time: a run that began before the switch went may
        // still have succeeded after the first failure was counted).
        let mut last_success = 0.0;
        wait_for(Duration::from_secs(10), "the last success is in etcd", || {
            last_success = gauge(first_port, "shardcron_job_last_success_timestamp_seconds").expect("last success");
            world
                .etcd_value("/shardcron/test/jobs/flaky/success")
                .and_then(|value| serde_json::from_slice::<shardcron::rules::record::RunRecord>(&value).ok())
                .is_some_and(|record| record.finished_at.timestamp_millis() as f64 / 1000.0 == last_success)
        });
        let index = world
            .nodes
            .iter()
            .position(|node| node.id == first)
            .expect("leader node");
        world.nodes[index].signal(libc::SIGKILL);
        wait_for(
            Duration::from_secs(30),
            "the other node leads and exports the last success",
            || gauge(other_port, "shardcron_job_last_success_timestamp_seconds").is_some(),
        );
        assert_eq!(
            gauge(other_port, "shardcron_job_last_success_timestamp_seconds"),
            Some(last_success),
            "the new leader continues the last success from etcd (all of its own runs fail)"
        );
    }
}

on_both_etcds! {
    fn readyz_follows_the_node_through_an_etcd_outage() {
        let mut world = World::new();
        let config = world.write_config("jobs.toml", 2, 2, &[("tick", EVERY_SECOND, "")]);
        let port = world.node("a", &config).start_serving();
        world.etcd.kill();
        wait_for(
            Duration::from_secs(30),
            "the node is not ready while etcd is down",
            || http_get(port, "/readyz").0.contains(" 503 "),
        );
        let (_, reason) = http_get(port, "/readyz");
        assert!(
            reason.starts_with("session lost") || reason.starts_with("etcd unreachable"),
            "{reason}"
        );
        assert!(http_get(port, "/healthz").0.contains(" 200 "), "alive while not ready");
        world.etcd.restart().expect("restart etcd");
        wait_ready(port);
    }
}

on_both_etcds! {
    fn systemd_hears_ready_reloading_and_stopping() {
        let mut world = World::new();
        let config = world.write_config("jobs.toml", 2, 2, &[("tick", EVERY_SECOND, "")]);
        let socket_path = world.dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&socket_path).expect("notify socket");
        socket.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        let node = world
            .node("a", &config)
            .env(&[("NOTIFY_SOCKET", socket_path.to_str().expect("path"))])
            .start();
        let mut heard = Vec::new();
        let hear_until = |wanted: &str, heard: &mut Vec<String>| {
            let mut buffer = [0u8; 4096];
            loop {
                let read = socket
                    .recv(&mut buffer)
                    .unwrap_or_else(|err| panic!("no {wanted} from the node ({err}); heard {heard:?}"));
                let message = String::from_utf8_lossy(&buffer[..read]).to_string();
                heard.push(message.clone());
                if message.lines().any(|line| line == wanted) {
                    return;
                }
            }
        };
        hear_until("READY=1", &mut heard);
        world.nodes[node].signal(libc::SIGHUP);
        hear_until("RELOADING=1", &mut heard);
        hear_until("READY=1", &mut heard);
        world.nodes[node].signal(libc::SIGTERM);
        hear_until("STOPPING=1", &mut heard);
        assert!(
            world.nodes[node].wait_exit(Duration::from_secs(20)).is_some(),
            "the node stopped"
        );
    }
}
