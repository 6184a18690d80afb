//! `run_on`, `fan_out` and `pool_shards`: jobs numbered into their pools' elections, and the
//! bound on how many elections one config makes.

use super::*;
use crate::rules::pools::{Election, FanOut};

fn job_table(name: &str, extra: &str) -> String {
    format!("\n[jobs.{name}]\nschedule = \"* * * * *\"\ncommand = \"true\"\n{extra}\n")
}

#[test]
fn jobs_with_run_on_are_numbered_into_their_pools_and_fanned_out_ones_into_the_nodes_own() {
    let text = format!(
        "{}{}{}{}{}",
        HEAD.replace("timezone = \"UTC\"", "timezone = \"UTC\"\npool_shards = 4"),
        job_table("report", ""),
        job_table("backup", "run_on = [\"eu-west\", \"db\"]"),
        job_table("vacuum", "run_on = [\"db\", \"eu-west\", \"db\"]"),
        job_table("rotate", "run_on = [\"web\"]\nfan_out = \"all\""),
    );
    let config = parse_str(&text).unwrap();
    let elections = &config.elections;
    // The fleet's 16, one pool of 4 ("web" has only a fanned-out job), the node's own.
    assert_eq!(elections.total(), 16 + 4 + 1);
    assert_eq!(elections.pools.len(), 1);
    let job = |name: &str| config.jobs.iter().find(|job| job.name == name).unwrap();
    assert_eq!(job("report").shard, crate::rules::shard::shard_of("report", 16));
    for name in ["backup", "vacuum"] {
        let Some(Election::Pool { pool, shard, shards: 4 }) = elections.locate(job(name).shard) else {
            panic!("{name} is in the db+eu-west pool");
        };
        assert_eq!(pool.id, "db+eu-west");
        assert_eq!(shard, job(name).pool_shard);
        assert_eq!(shard, crate::rules::shard::shard_of(name, 4));
    }
    assert_eq!(elections.locate(job("rotate").shard), Some(Election::Own));
    assert_eq!(job("rotate").fan_out, FanOut::All);
}

#[test]
fn a_config_of_more_elections_than_one_fleet_of_4096_shards_is_refused() {
    let pools: String = (0..16)
        .map(|index| job_table(&format!("j{index}"), &format!("run_on = [\"t{index}\"]")))
        .collect();
    let head = HEAD
        .replace("shards = 16", "shards = 4000")
        .replace("timezone = \"UTC\"", "timezone = \"UTC\"\npool_shards = 7");
    let err = parse_str(&format!("{head}{pools}")).unwrap_err();
    assert_eq!(err.field.as_deref(), Some("cluster.pool_shards"));
    assert!(err.message.contains("4112 elections; at most 4096"), "{}", err.message);
    let head = head.replace("pool_shards = 7", "pool_shards = 6");
    assert_eq!(parse_str(&format!("{head}{pools}")).unwrap().elections.shared(), 4096);
}

#[test]
fn bad_tags_and_fan_out_name_the_job_and_field() {
    let cases = [
        ("run_on = [\"a/b\"]", "run_on", "invalid tag \"a/b\""),
        ("run_on = [\"\"]", "run_on", "invalid tag \"\""),
        ("fan_out = \"some\"", "fan_out", "unknown variant"),
    ];
    for (extra, field, message) in cases {
        let err = parse_str(&format!("{HEAD}{}", job_table("j", extra))).unwrap_err();
        assert_eq!(err.job.as_deref(), Some("j"), "{extra}");
        assert!(err.to_string().contains(message), "{extra}: {err}");
        assert!(err.to_string().contains(field), "{extra}: {err}");
    }
    let many: Vec<String> = (0..33).map(|index| format!("\"t{index}\"")).collect();
    let err = parse_str(&format!(
        "{HEAD}{}",
        job_table("j", &format!("run_on = [{}]", many.join(", ")))
    ))
    .unwrap_err();
    assert!(err.message.contains("at most 32 tags"), "{err}");
    let err = parse_str(&HEAD.replace("timezone = \"UTC\"", "timezone = \"UTC\"\npool_shards = 0")).unwrap_err();
    assert_eq!(err.field.as_deref(), Some("cluster.pool_shards"));
}
