//! `[blackouts.<name>]`, `[notify.<name>]`, the lists of them that `[cluster]` and jobs give,
//! and `ping_url`: what is read, and every bad one named by its field.

use chrono::{DateTime, Utc};

use super::*;
use crate::rules::notify::{Event, HeaderValue, PingMethod};

fn job_table(name: &str, extra: &str) -> String {
    format!("\n[jobs.{name}]\nschedule = \"* * * * *\"\ncommand = \"true\"\n{extra}\n")
}

/// `HEAD` with `[cluster]` lines added after its first line.
fn head_with(cluster_lines: &str) -> String {
    HEAD.replacen("[cluster]\n", &format!("[cluster]\n{cluster_lines}\n"), 1)
}

#[test]
fn the_clusters_blackouts_and_notifiers_come_first_then_a_jobs_own_each_once() {
    let text = format!(
        "{}\n[blackouts.freeze]\ndates = [\"2026-12-24\", \"2026-12-25\"]\ntimezone = \"Europe/Berlin\"\n\n[blackouts.nightly]\nwindows = [{{ start = \"0 2 * * *\", duration = \"2h\" }}]\n\n[notify.ops]\nurl = \"https://hooks.example.com/x\"\nheaders = {{ Authorization = {{ env = \"HOOK_TOKEN\" }}, X-Team = \"db\" }}\n\n[notify.pager]\nurl = \"http://127.0.0.1:9/p\"\non = [\"lost\", \"missed\"]\n{}{}",
        head_with("blackouts = [\"freeze\"]\nnotify = [\"ops\"]"),
        job_table(
            "backup",
            "blackouts = [\"nightly\", \"freeze\"]\nnotify = [\"pager\"]\nping_url = \"https://hc-ping.com/abc\"\nping_method = \"POST\""
        ),
        job_table("report", ""),
    );
    let config = parse_str(&text).unwrap();
    let job = |name: &str| config.jobs.iter().find(|job| job.name == name).unwrap();
    let names = |job: &Job| -> (Vec<String>, Vec<String>) {
        (
            job.blackouts.iter().map(|b| b.name.clone()).collect(),
            job.notify.iter().map(|n| n.name.clone()).collect(),
        )
    };
    assert_eq!(
        names(job("backup")),
        (
            vec!["freeze".into(), "nightly".into()],
            vec!["ops".into(), "pager".into()]
        )
    );
    assert_eq!(names(job("report")), (vec!["freeze".into()], vec!["ops".into()]));
    let ping = job("backup").ping.clone().expect("a ping");
    assert_eq!(
        (ping.url.as_str(), ping.method),
        ("https://hc-ping.com/abc", PingMethod::Post)
    );
    assert!(job("report").ping.is_none());
    let ops = &config.notifiers["ops"];
    assert_eq!(ops.on, Event::DEFAULT.into_iter().collect());
    assert!(ops
        .headers
        .contains(&("Authorization".into(), HeaderValue::Env("HOOK_TOKEN".into()))));
    assert_eq!(config.blackouts["freeze"].zone, chrono_tz::Europe::Berlin);
    assert_eq!(config.blackouts["nightly"].zone, config.cluster.timezone);
    // Nothing of a notifier's URL or headers in what a debug print of the config shows.
    let printed = format!("{:?}", config.jobs);
    assert!(
        !printed.contains("hooks.example.com") && !printed.contains("hc-ping.com"),
        "{printed}"
    );
}

#[test]
fn bad_blackout_and_notifier_tables_name_their_field() {
    let cases = [
        ("[blackouts.b]\ntimezone = \"UTC\"", "blackouts.b", "covers no time"),
        (
            "[blackouts.b]\nwindows = [{ start = \"0 2 * * *\" }]",
            "blackouts.b.windows.duration",
            "never ends",
        ),
        (
            "[blackouts.b]\nwindows = [{ duration = \"1h\" }]",
            "blackouts.b.windows.start",
            "missing start",
        ),
        (
            "[blackouts.b]\nwindows = [{ start = \"0 2 * * *\", duration = \"0s\" }]",
            "blackouts.b.windows.duration",
            "no time",
        ),
        (
            "[blackouts.b]\nwindows = [{ start = \"0 2 * * *\", duration = \"400d\" }]",
            "blackouts.b.windows.duration",
            "invalid duration",
        ),
        (
            "[blackouts.b]\nwindows = [{ start = \"0 25 * * *\", duration = \"1h\" }]",
            "blackouts.b.windows.start",
            "invalid schedule",
        ),
        (
            "[blackouts.b]\ndates = [\"2026-02-30\"]",
            "blackouts.b.dates",
            "is not a date",
        ),
        (
            "[blackouts.b]\ndates = [\"2026-12-24\"]\ntimezone = \"Mars/Base\"",
            "blackouts.b.timezone",
            "",
        ),
        ("[notify.n]\non = [\"failure\"]", "notify.n.url", "missing url"),
        ("[notify.n]\nurl = \"ftp://x/y\"", "notify.n.url", "http:// or https://"),
        (
            "[notify.n]\nurl = \"http://x\"\non = [\"fail\"]",
            "notify.n.on",
            "unknown event \"fail\"",
        ),
        (
            "[notify.n]\nurl = \"http://x\"\nheaders = { A = { env = \"X\", file = \"/y\" } }",
            "notify.n.headers.A",
            "{ env",
        ),
        (
            "[notify.n]\nurl = \"http://x\"\nheaders = { A = { file = \"relative\" } }",
            "notify.n.headers.A",
            "absolute",
        ),
        (
            "[notify.n]\nurl = \"http://x\"\nheaders = { \"A B\" = \"v\" }",
            "notify.n.headers.A B",
            "header name",
        ),
    ];
    for (table, field, message) in cases {
        let err = parse_str(&format!("{HEAD}\n{table}\n")).unwrap_err();
        assert!(err.to_string().contains(message), "{table}: {err}");
        assert_eq!(err.field.as_deref(), Some(field), "{table}: {err}");
    }
}

#[test]
fn unknown_names_and_bad_pings_name_their_field() {
    let blackout = "[blackouts.freeze]\ndates = [\"2026-12-24\"]\n";
    for (extra, field, message) in [
        (
            "blackouts = [\"frost\"]",
            "blackouts",
            "unknown name \"frost\": blackouts defined: freeze",
        ),
        ("notify = [\"ops\"]", "notify", "defines no [notify.<name>]"),
        ("ping_url = \"hc-ping.com/x\"", "ping_url", "http:// or https://"),
        ("ping_method = \"POST\"", "ping_method", "without ping_url"),
    ] {
        let err = parse_str(&format!("{HEAD}\n{blackout}{}", job_table("j", extra))).unwrap_err();
        assert_eq!(
            (err.job.as_deref(), err.field.as_deref()),
            (Some("j"), Some(field)),
            "{extra}: {err}"
        );
        assert!(err.message.contains(message), "{extra}: {err}");
    }
    let err = parse_str(&format!("{}\n{blackout}", head_with("blackouts = [\"frost\"]"))).unwrap_err();
    assert_eq!(
        (err.job.as_deref(), err.field.as_deref()),
        (None, Some("blackouts")),
        "{err}"
    );
}

#[test]
fn the_example_of_blackouts_and_notifications_is_valid() {
    let text = include_str!("../../../../config/examples/blackouts-and-notify.toml");
    let config = parse_str(text).unwrap();
    let invoices = config.jobs.iter().find(|job| job.name == "nightly-invoices").unwrap();
    let names: Vec<&str> = invoices.blackouts.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["holidays", "maintenance"]);
    let christmas_eve = DateTime::parse_from_rfc3339("2026-12-24T01:30:00+01:00")
        .unwrap()
        .with_timezone(&Utc);
    assert!(crate::rules::blackouts::covering(&invoices.blackouts, christmas_eve).is_some());
}

/// A header may not send the node's own secrets: `check` refuses the source with the header's
/// line and field, whatever the `[etcd]` section names.
#[test]
fn headers_may_not_name_the_nodes_own_secrets() {
    let etcd = "username = \"cron\"\npassword_env = \"ETCD_PW\"\n[etcd.tls]\ncert = \"/etc/shardcron/node.pem\"\nkey = \"/etc/shardcron/node-key.pem\"";
    let by_file = "username = \"cron\"\npassword_file = \"/etc/shardcron/etcd-password\"";
    let cases: [(&str, &str, Option<&str>); 14] = [
        (
            etcd,
            "{ env = \"ETCD_PW\" }",
            Some("node's own secret ([etcd] password_env)"),
        ),
        (
            etcd,
            "{ env = \"SHARDCRON_API_TOKEN_ENV\" }",
            Some("SHARDCRON_* variables"),
        ),
        (
            etcd,
            "{ env = \"SHARDCRON_ETCD_PASSWORD\" }",
            Some("SHARDCRON_* variables"),
        ),
        (etcd, "{ env = \"CREDENTIALS_DIRECTORY\" }", Some("systemd credentials")),
        (
            etcd,
            "{ file = \"/etc/shardcron/node-key.pem\" }",
            Some("([etcd] tls.key)"),
        ),
        (
            etcd,
            "{ file = \"/run/credentials/shardcron.service/api-token\" }",
            Some("under /run/credentials"),
        ),
        (
            etcd,
            "{ file = \"/run/./credentials/shardcron.service/etcd-password\" }",
            Some("under /run/credentials"),
        ),
        (
            by_file,
            "{ file = \"/etc/shardcron/etcd-password\" }",
            Some("([etcd] password_file)"),
        ),
        (
            by_file,
            "{ file = \"/etc/shardcron/hooks/../etcd-password\" }",
            Some("([etcd] password_file)"),
        ),
        (by_file, "{ env = \"ETCD_PW\" }", None),
        (etcd, "{ env = \"OPS_HOOK_TOKEN\" }", None),
        (etcd, "{ file = \"/etc/shardcron/node.pem\" }", None),
        (etcd, "{ file = \"/etc/shardcron/secrets/ops-hook\" }", None),
        (etcd, "\"SHARDCRON_API_TOKEN_ENV\"", None),
    ];
    for (etcd_lines, source, refused) in cases {
        let text = format!(
            "{}\n[notify.ops]\nurl = \"https://hooks.example.com/x\"\nheaders = {{ Authorization = {source} }}\n",
            with_etcd(etcd_lines)
        );
        let line = text
            .lines()
            .position(|line| line.starts_with("headers"))
            .expect("headers")
            + 1;
        match (parse_str(&text), refused) {
            (Ok(_), None) => {}
            (Ok(_), Some(why)) => panic!("{source} taken; expected {why:?}"),
            (Err(err), None) => panic!("{source} refused: {err}"),
            (Err(err), Some(why)) => {
                let shown = err.to_string();
                assert!(shown.contains(why), "{source}: {shown}");
                assert!(shown.contains("which the notifier would send to its URL"), "{shown}");
                assert_eq!(
                    err.field.as_deref(),
                    Some("notify.ops.headers.Authorization"),
                    "{shown}"
                );
                assert_eq!(err.location.map(|(at, _)| at), Some(line), "{shown}");
            }
        }
    }
}
