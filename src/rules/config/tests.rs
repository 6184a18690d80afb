use std::path::Path;
use std::time::Duration;

use super::*;

mod errors;
mod groups;
mod named;
mod pools;

const HEAD: &str = r#"[cluster]
name = "prod"
shards = 16
lease_ttl = "10s"
timezone = "UTC"

[etcd]
endpoints = ["http://127.0.0.1:2379"]
"#;

fn parse_str(text: &str) -> Result<Config, ConfigError> {
    parse(Path::new("jobs.toml"), text)
}

/// `HEAD` with `lines` after `[etcd]`'s endpoints (line 9 on).
fn with_etcd(lines: &str) -> String {
    HEAD.replace(
        "endpoints = [\"http://127.0.0.1:2379\"]",
        &format!("endpoints = [\"http://127.0.0.1:2379\"]\n{lines}"),
    )
}

#[test]
fn secret_sources_validate() {
    let config = parse_str(&format!(
        "{}\n[jobs.backup]\nschedule = \"@daily\"\ncommand = \"true\"\nenv_file = \"/etc/shardcron/secrets/backup.env\"\n",
        with_etcd(
            "username = \"cron\"\npassword_file = \"/etc/shardcron/secrets/etcd-password\"\n[etcd.tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\""
        )
    ))
    .unwrap();
    assert_eq!(
        config.etcd.password_file.as_deref(),
        Some(Path::new("/etc/shardcron/secrets/etcd-password"))
    );
    assert_eq!(
        config.jobs[0].env_file.as_deref(),
        Some(Path::new("/etc/shardcron/secrets/backup.env"))
    );
    // The credential is a source only where the node runs: `check` accepts a username alone.
    assert!(parse_str(&with_etcd("username = \"cron\"")).is_ok());
}

fn with_job(job: &str) -> String {
    format!("{HEAD}\n[jobs.backup]\n{job}\n")
}

#[test]
fn a_full_job_validates() {
    let config = parse_str(&with_job(
        r#"schedule = "*/5 * * * *"
command = "true"
timezone = "Europe/Berlin"
timeout = "10m"
catch_up = "all"
starting_deadline = "5m"
overlap = "allow"
delivery = "at-most-once"
working_dir = "/tmp"
env = { LOG_LEVEL = "info" }"#,
    ))
    .unwrap();
    let job = &config.jobs[0];
    assert_eq!(job.name, "backup");
    assert_eq!(job.shard, crate::rules::shard::shard_of("backup", 16));
    assert_eq!(job.schedule.zone(), chrono_tz::Europe::Berlin);
    assert_eq!(job.timeout, Some(Duration::from_secs(600)));
    assert_eq!(job.catch_up, CatchUp::All);
    assert_eq!(job.starting_deadline, Some(Duration::from_secs(300)));
    assert_eq!(job.overlap, Overlap::Allow);
    assert_eq!(job.delivery, Delivery::AtMostOnce);
    assert_eq!(job.env.get("LOG_LEVEL").map(String::as_str), Some("info"));
    assert_eq!(config.cluster.lease_ttl, Duration::from_secs(10));
}

#[test]
fn gone_node_retention_defaults_to_a_day() {
    let retention = |lines: &str| parse_str(&with_etcd(lines)).unwrap().etcd.gone_node_retention;
    assert_eq!(retention(""), Duration::from_secs(86_400));
    assert_eq!(retention("gone_node_retention = \"10s\""), Duration::from_secs(10));
    assert_eq!(
        retention("gone_node_retention = \"30d\""),
        Duration::from_secs(30 * 86_400)
    );
}

#[test]
fn etcd_compaction_defaults_to_five_minutes_and_can_be_off() {
    let compaction = |lines: &str| parse_str(&with_etcd(lines)).unwrap().etcd.compaction;
    assert_eq!(compaction(""), Some(Duration::from_secs(300)));
    assert_eq!(compaction("compaction = \"off\""), None);
    assert_eq!(compaction("compaction = \"1h\""), Some(Duration::from_secs(3600)));
    assert_eq!(compaction("compaction = \"10s\""), Some(Duration::from_secs(10)));
}

#[test]
fn defaults_apply() {
    let config = parse_str(&with_job("schedule = \"@daily\"\ncommand = \"true\"")).unwrap();
    let job = &config.jobs[0];
    assert_eq!(job.catch_up, CatchUp::Latest);
    assert_eq!(job.overlap, Overlap::Skip);
    assert_eq!(job.delivery, Delivery::AtLeastOnce);
    assert_eq!(job.schedule.zone(), chrono_tz::UTC);
    assert!(job.timeout.is_none() && job.starting_deadline.is_none());
    assert_eq!(job.kill_grace, DEFAULT_KILL_GRACE);
    assert_eq!((job.retries, job.retry_backoff), (0, DEFAULT_RETRY_BACKOFF));
}

#[test]
fn retries_kill_grace_and_replace_validate() {
    let config = parse_str(&with_job(
        "schedule = \"@hourly\"\ncommand = \"true\"\nretries = 3\nretry_backoff = \"500ms\"\nkill_grace = \"2s\"\noverlap = \"replace\"",
    ))
    .unwrap();
    let job = &config.jobs[0];
    assert_eq!((job.retries, job.retry_backoff), (3, Duration::from_millis(500)));
    assert_eq!(job.kill_grace, Duration::from_secs(2));
    assert_eq!(job.overlap, Overlap::Replace);
}

#[test]
fn output_tail_and_log_output_validate() {
    let job = |extra: &str| {
        parse_str(&with_job(&format!(
            "schedule = \"@hourly\"\ncommand = \"true\"\n{extra}"
        )))
    };
    let config = job("output_tail = \"16KiB\"\nlog_output = \"tail\"").unwrap();
    assert_eq!(config.jobs[0].output_tail, 16 * 1024);
    assert_eq!(config.jobs[0].log_output, LogOutput::Tail);
    let defaults = job("").unwrap();
    assert_eq!(defaults.jobs[0].output_tail, 4096);
    assert_eq!(defaults.jobs[0].log_output, LogOutput::All);
    assert_eq!(job("output_tail = 0").unwrap().jobs[0].output_tail, 0);
    for (bad, says) in [
        ("output_tail = \"65KiB\"", "at most \"64KiB\""),
        ("output_tail = \"4 potatoes\"", "unknown size unit"),
        ("output_tail = -1", "is not a size"),
        ("log_output = \"some\"", "unknown variant"),
    ] {
        let err = job(bad).unwrap_err().to_string();
        assert!(err.contains(says), "{bad}: {err}");
        assert!(err.contains("job \"backup\", field"), "{bad}: {err}");
    }
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let err = load(Path::new("/nonexistent/jobs.toml")).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("/nonexistent/jobs.toml: cannot read config file"),
        "{err}"
    );
}

#[test]
fn schedules_are_parsed_once_per_expression_and_zone() {
    let mut text = HEAD.to_string();
    for i in 0..50 {
        let zone = if i % 2 == 0 { "UTC" } else { "Europe/Berlin" };
        text.push_str(&format!(
            "[jobs.j{i}]\nschedule = \"*/5 * * * *\"\ncommand = \"true\"\ntimezone = \"{zone}\"\n"
        ));
    }
    let config = parse_str(&text).unwrap();
    let distinct: std::collections::HashSet<*const Schedule> =
        config.jobs.iter().map(|job| Arc::as_ptr(&job.schedule)).collect();
    assert_eq!(distinct.len(), 2);
}

/// A file that exercises what the piece reader must get right: sub-tables, quoted names,
/// comments and strings holding `[jobs.x]`, arrays over several lines, a table between jobs.
const MANY_SHAPES: &str = r#"# [jobs.not_a_header] in a comment
[cluster]
name = "prod"
shards = 16

[jobs.a]
schedule = "* * * * *"
command = """
echo one
[jobs.inside_a_string]
"""

[jobs.a.env]
K = "v"

[jobs."b.dotted"]
schedule = "0 * * * *"
command = 'echo [jobs.c]'

[etcd]
endpoints = [
  "http://127.0.0.1:2379",
  "http://127.0.0.1:2380",
]

[ jobs . 'c' ]
schedule = "*/5 * * * *"
command = "true"
env = { A = "[x]", B = "{" }

[jobs.d]
schedule = "@daily"
command = "true"
timezone = "Europe/Berlin"
"#;

#[test]
fn reading_in_pieces_gives_what_reading_whole_gives() {
    let source = Source {
        path: Path::new("jobs.toml"),
        text: MANY_SHAPES,
    };
    let whole = parse_whole(&source).unwrap();
    for per_piece in [1, 2, 3, 1000] {
        let pieces = parse_in_pieces(&source, per_piece).expect("read in pieces");
        assert_eq!(pieces.cluster, whole.cluster);
        assert_eq!(pieces.etcd, whole.etcd);
        assert_eq!(
            format!("{:?}", pieces.jobs),
            format!("{:?}", whole.jobs),
            "{per_piece} per piece"
        );
    }
    let names: Vec<&str> = whole.jobs.iter().map(|job| job.name.as_str()).collect();
    assert_eq!(names, ["a", "b.dotted", "c", "d"]);
    assert_eq!(whole.jobs[0].command, "echo one\n[jobs.inside_a_string]\n");
}

#[test]
fn files_the_piece_reader_does_not_take_are_read_whole() {
    let read_whole = |jobs: &str| {
        let text = format!("{HEAD}\n{jobs}");
        let source = Source {
            path: Path::new("jobs.toml"),
            text: &text,
        };
        let in_pieces = parse_in_pieces(&source, 2).is_none();
        let whole = parse_whole(&source).map(|parts| parts.jobs.len());
        (in_pieces, whole)
    };
    // A [jobs] table with inline tables.
    assert_eq!(
        read_whole("[jobs]\na = { schedule = \"@daily\", command = \"true\" }\n"),
        (true, Ok(1))
    );
    // A job's tables apart, with another job's between.
    let apart = "[jobs.a]\nschedule = \"@daily\"\ncommand = \"true\"\n[jobs.b]\nschedule = \"@daily\"\ncommand = \"true\"\n[jobs.a.env]\nK = \"v\"\n";
    assert_eq!(read_whole(apart), (true, Ok(2)));
    // Any error: the whole-document reader gives the message.
    let (declined, whole) = read_whole("[jobs.a]\nschedule = \"@daily\"\n");
    assert!(declined);
    assert!(whole.unwrap_err().to_string().contains("missing command"));
    let (declined, whole) =
        read_whole("[jobs.a]\nschedule = \"@daily\"\ncommand = \"true\"\n[jobs.a]\ncommand = \"x\"\n");
    assert!(declined);
    assert!(whole.is_err());
}

#[test]
fn a_schedule_list_and_hash_spread_items_validate() {
    let config = parse_str(&format!(
        "{HEAD}\n[jobs.listed]\nschedule = [\"0 9 * * 1-5\", \"0 12 * * SAT\"]\ncommand = \"true\"\n\
         [jobs.spread-a]\nschedule = \"H H * * *\"\ncommand = \"true\"\n\
         [jobs.spread-b]\nschedule = \"H H * * *\"\ncommand = \"true\"\n"
    ))
    .unwrap();
    let schedule = |name: &str| &config.jobs.iter().find(|job| job.name == name).unwrap().schedule;
    assert_eq!(schedule("listed").expanded(), "0 9 * * 1-5 | 0 12 * * SAT");
    assert_eq!(schedule("listed").label(), "0 9 * * 1-5 | 0 12 * * SAT in UTC");
    // Jobs that write the same `H` schedule do not share one parsed schedule: each gets its own.
    for name in ["spread-a", "spread-b"] {
        assert_eq!(
            schedule(name).expanded(),
            crate::rules::spread::expand("H H * * *", name).unwrap()
        );
    }
}
