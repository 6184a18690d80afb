//! Upgrading shardcron over a cluster's records (#44): a node of this build takes over the
//! records the previous release left in etcd (`tests/fixtures/records-0.1.0-4f05eb0.json`, read
//! from a running etcd under that release), and refuses to start on records of a newer format
//! rather than misread them.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::*;

const FIXTURE: &str = "tests/fixtures/records-0.1.0-4f05eb0";

/// The fixture's config, on this world's etcd.
fn previous_config(world: &World) -> PathBuf {
    let text = std::fs::read_to_string(format!("{}/{FIXTURE}.toml", env!("CARGO_MANIFEST_DIR"))).expect("the fixture");
    let endpoints = text
        .lines()
        .find(|line| line.starts_with("endpoints"))
        .expect("the fixture's endpoints")
        .to_owned();
    let text = text.replace(&endpoints, &format!("endpoints = {:?}", world.etcd.client_urls()));
    let path = world.dir.path().join("jobs.toml");
    std::fs::write(&path, text).expect("write the config");
    path
}

/// Puts `records` (key, value) into the world's etcd, without leases: the nodes that held
/// them are gone.
fn put_records(world: &World, records: &[(String, String)]) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect(world.etcd.client_urls(), None)
            .await
            .expect("etcd");
        for (key, value) in records {
            client.put(key.as_str(), value.as_str(), None).await.expect("put");
        }
    });
}

/// The fixture's records but those that lived on the old node's lease (its election
/// candidacies, its group slot): etcd deleted them with it.
fn fixture_records() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(format!("{}/{FIXTURE}.json", env!("CARGO_MANIFEST_DIR"))).expect("the fixture");
    let records: std::collections::BTreeMap<String, String> = serde_json::from_str(&text).expect("JSON");
    records
        .into_iter()
        .filter(|(key, _)| !key.starts_with("/shardcron/prev/shards/") && !key.contains("/slots/"))
        .collect()
}

#[test]
fn a_node_takes_over_the_records_the_previous_release_left() {
    let mut world = World::new();
    put_records(&world, &fixture_records());
    let config = previous_config(&world);
    step("this build's history of the previous release's runs, their output kept apart or inside");
    let history = shardcron(&config, &["history", "every", "--json"]);
    let history = String::from_utf8_lossy(&history.stdout).to_string();
    assert!(
        history.contains("\"node\": \"old-a\"") && history.contains("\"stdout\": \"every 2026-12-07T14:56:26Z\\n\""),
        "{history}"
    );
    step("a node of this build on the previous release's records");
    world.node("a", &config).start();
    let mut history = String::new();
    wait_for(
        Duration::from_secs(30),
        "a run of every by this build in its history",
        || {
            let output = shardcron(&config, &["history", "every", "--json"]);
            history = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            history.contains("\"node\":\"a\"") || history.contains("\"node\": \"a\"")
        },
    );
    let status = shardcron(&config, &["status"]);
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    let paused = status
        .lines()
        .find(|line| line.starts_with("paused "))
        .unwrap_or_else(|| panic!("no row of the paused job: {status}"));
    assert!(
        paused.contains("paused"),
        "the previous release's pause holds: {paused}"
    );
    assert!(
        status.contains("every     10/10  done"),
        "the previous release's backfill shows done: {status}"
    );
    let log = world.nodes[0].log_text();
    assert!(
        log.contains("record format written"),
        "the first node of this release writes the format: {log}"
    );
}

#[test]
fn a_node_refuses_records_of_a_newer_format() {
    let mut world = World::new();
    put_records(
        &world,
        &[("/shardcron/test/format".to_owned(), r#"{"format":9}"#.to_owned())],
    );
    let config = world.write_config("jobs.toml", 1, 5, &every_second(&job_names(1, 1), ""));
    world.node("a", &config).start();
    let code = world.nodes[0].wait_exit(Duration::from_secs(30));
    assert!(
        matches!(code, Some(code) if code != 0),
        "the node stops with an error: {code:?}"
    );
    let log = world.nodes[0].log_text();
    assert!(
        log.contains("format 9") && log.contains("reads formats up to 1"),
        "it says why: {log}"
    );
    assert!(!world.runs_file().exists(), "no job ran");
}
