//! The alerting rules and the Grafana dashboard in `examples/`. `promtool` (Debian's `prometheus`
//! package, installed by `scripts/setup`) checks the rules and runs their unit tests,
//! `examples/prometheus/alerts_test.yml`; the dashboard is checked for the shape Grafana's
//! "Import dashboard" takes, and its queries for PromQL that parses. Both may only name metrics a
//! node exports: [`KNOWN_METRICS`].

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Every metric a node serves on `/metrics`: counters with their `_total`, histograms by their
/// base name (queried through `_bucket`, `_count` and `_sum`, see [`HISTOGRAMS`]).
pub(crate) const KNOWN_METRICS: &[&str] = &[
    "shardcron_runs_total",
    "shardcron_run_duration_seconds",
    "shardcron_firing_lateness_seconds",
    "shardcron_retries_total",
    "shardcron_triggered_runs_total",
    "shardcron_shards_led",
    "shardcron_claim_failures_total",
    "shardcron_catch_up_runs_total",
    "shardcron_skipped_overlaps_total",
    "shardcron_session_losses_total",
    "shardcron_etcd_errors_total",
    "shardcron_log_lines_dropped_total",
    "shardcron_pauses_in_force",
    "shardcron_runs_in_flight",
    "shardcron_shards_without_leader",
    "shardcron_jobs_without_eligible_node",
    "shardcron_election_foreign_keys",
    "shardcron_config_drift_nodes",
    "shardcron_etcd_db_bytes",
    "shardcron_etcd_db_in_use_bytes",
    "shardcron_etcd_quota_bytes",
    "shardcron_etcd_nospace",
    "shardcron_build_info",
    "shardcron_job_last_success_timestamp_seconds",
    "shardcron_job_next_run_timestamp_seconds",
    "shardcron_job_interval_seconds",
    "shardcron_group_limit",
    "shardcron_group_running",
    "shardcron_group_waiting",
    "shardcron_notifications_total",
    "shardcron_pings_total",
    "shardcron_blackout_skips_total",
];

/// The histograms among [`KNOWN_METRICS`]: a query names their series, never the bare name.
const HISTOGRAMS: &[&str] = &["shardcron_run_duration_seconds", "shardcron_firing_lateness_seconds"];

const HISTOGRAM_SERIES: &[&str] = &["_bucket", "_count", "_sum"];

const ALERTS: &str = "examples/prometheus/alerts.yml";
const ALERTS_TEST: &str = "examples/prometheus/alerts_test.yml";
const DASHBOARD: &str = "examples/grafana/shardcron.json";

/// Grafana's grid is 24 columns wide.
const GRID_COLUMNS: i64 = 24;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|err| panic!("cannot read {path}: {err}"))
}

/// Runs `promtool` in the repository and fails with its output unless it succeeds.
fn promtool(args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|err| {
            panic!("cannot run promtool ({err}): scripts/setup installs it (Debian package prometheus)")
        });
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "promtool {} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        args.join(" "),
        out.status
    );
    stdout.into_owned()
}

/// The `shardcron_...` names in `text`: each `shardcron_` not preceded by a name's character,
/// with the lowercase letters, digits and underscores after it.
fn metric_names(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let in_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut names = BTreeSet::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("shardcron_") {
        let start = from + found;
        let mut end = start + "shardcron_".len();
        while end < bytes.len()
            && (bytes[end].is_ascii_lowercase() || bytes[end].is_ascii_digit() || bytes[end] == b'_')
        {
            end += 1;
        }
        if start == 0 || !in_name(bytes[start - 1]) {
            names.insert(text[start..end].to_string());
        }
        from = end;
    }
    names
}

/// The name a query may use for `name`: itself, or the histogram it is a series of.
fn known_as(name: &str) -> Option<&'static str> {
    if let Some(histogram) = HISTOGRAMS.iter().find(|histogram| {
        name.strip_prefix(**histogram)
            .is_some_and(|suffix| HISTOGRAM_SERIES.contains(&suffix))
    }) {
        return Some(histogram);
    }
    KNOWN_METRICS
        .iter()
        .find(|known| **known == name && !HISTOGRAMS.contains(known))
        .copied()
}

/// The names in `names` that are not exported, for a message.
fn unknown(names: &BTreeSet<String>) -> Vec<&str> {
    names
        .iter()
        .map(String::as_str)
        .filter(|name| known_as(name).is_none())
        .collect()
}

#[test]
fn known_metrics_list_each_name_once_and_histograms_among_them() {
    let unique: HashSet<_> = KNOWN_METRICS.iter().collect();
    assert_eq!(unique.len(), KNOWN_METRICS.len(), "a name twice in KNOWN_METRICS");
    for histogram in HISTOGRAMS {
        assert!(KNOWN_METRICS.contains(histogram), "{histogram} is not in KNOWN_METRICS");
    }
    for name in KNOWN_METRICS {
        assert_eq!(
            metric_names(name).into_iter().collect::<Vec<_>>(),
            [*name],
            "{name} scans as itself"
        );
    }
}

#[test]
fn alert_rules_pass_promtool_check() {
    let out = promtool(&["check", "rules", ALERTS]);
    assert!(out.contains("SUCCESS"), "{out}");

    // promtool does not know which metrics exist: a misspelt name is a rule that never fires.
    let text = read(ALERTS);
    let names = metric_names(&text);
    assert!(!names.is_empty(), "no shardcron_ metric in {ALERTS}");
    assert_eq!(unknown(&names), Vec::<&str>::new(), "{ALERTS} uses metrics not in KNOWN_METRICS ({KNOWN_METRICS:?}; a histogram is queried through _bucket, _count or _sum)");
    for alert in [
        "ShardcronJobLate",
        "ShardcronJobNotSucceeding",
        "ShardcronJobFailing",
        "ShardcronShardWithoutLeader",
        "ShardcronJobsWithoutEligibleNode",
        "ShardcronSessionLosses",
        "ShardcronClaimFailures",
        "ShardcronConfigDrift",
        "ShardcronEtcdNearQuota",
        "ShardcronEtcdNoSpace",
    ] {
        assert!(text.contains(&format!("- alert: {alert}\n")), "{ALERTS} has no {alert}");
    }
}

#[test]
fn alert_rules_pass_their_unit_tests() {
    let out = promtool(&["test", "rules", ALERTS_TEST]);
    assert!(out.contains("SUCCESS"), "{out}");

    // The synthetic series stand for real ones only if their names are exported.
    let text = read(ALERTS_TEST);
    let names = metric_names(&text);
    assert_eq!(
        unknown(&names),
        Vec::<&str>::new(),
        "{ALERTS_TEST} has series not in KNOWN_METRICS"
    );
    // Every alert of the rules is tested, firing and quiet.
    let rules = read(ALERTS);
    for alert in rules.lines().filter_map(|line| line.trim().strip_prefix("- alert: ")) {
        let evaluations = text.matches(&format!("alertname: {alert}\n")).count();
        let quiet = text
            .matches(&format!("alertname: {alert}\n        exp_alerts: []\n"))
            .count();
        assert!(
            quiet >= 1 && evaluations > quiet,
            "{ALERTS_TEST} evaluates {alert} {evaluations} times, {quiet} of them quiet: it needs both"
        );
    }
}

fn dashboard() -> (String, Value) {
    let text = read(DASHBOARD);
    let dashboard = serde_json::from_str(&text).unwrap_or_else(|err| panic!("{DASHBOARD} is not JSON: {err}"));
    (text, dashboard)
}

/// The names `${NAME}` and `$NAME` in `text` refer to (Grafana's `$__...` built-ins left out).
fn variable_references(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        let (braced, after) = match rest.strip_prefix('{') {
            Some(after) => (true, after),
            None => (false, rest),
        };
        let len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..len];
        if !name.is_empty() && !name.starts_with("__") && (!braced || after[len..].starts_with(['}', ':'])) {
            names.insert(name.to_string());
        }
    }
    names
}

#[test]
fn grafana_dashboard_has_the_shape_grafana_imports() {
    let (text, dashboard) = dashboard();
    let mut problems = Vec::new();

    assert!(
        dashboard["title"].as_str().is_some_and(|title| !title.is_empty()),
        "no title"
    );
    assert_eq!(dashboard["uid"], "shardcron");
    let schema = dashboard["schemaVersion"].as_i64().expect("schemaVersion is a number");
    // Grafana 10 and 11 write 36 to 39; older dashboards it migrates, newer ones it may not read.
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    assert!(
        dashboard.get("id").is_none_or(Value::is_null),
        "a dashboard to import has no id of its own: Grafana gives it one"
    );

    // Import asks for each input and writes the answer in place of `${NAME}`.
    let inputs = dashboard["__inputs"].as_array().expect("__inputs");
    assert!(
        inputs
            .iter()
            .any(|input| input["type"] == "datasource" && input["pluginId"] == "prometheus"),
        "__inputs asks for no Prometheus data source: {inputs:?}"
    );
    let input_names: BTreeSet<String> = inputs
        .iter()
        .map(|input| input["name"].as_str().expect("input name").to_string())
        .collect();

    let variables = dashboard["templating"]["list"].as_array().expect("templating.list");
    let variable = |name: &str| {
        variables
            .iter()
            .find(|variable| variable["name"] == name)
            .unwrap_or_else(|| panic!("no templating variable {name}"))
    };
    let datasource = variable("datasource");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    let job = variable("job");
    assert_eq!(job["type"], "query");
    assert_eq!(job["datasource"]["uid"], "${datasource}");
    let job_query = job["query"]
        .as_str()
        .or_else(|| job["query"]["query"].as_str())
        .expect("the job variable's query");
    assert_eq!(job_query, "label_values(shardcron_runs_total, job)");
    let variable_names: BTreeSet<String> = variables
        .iter()
        .map(|variable| variable["name"].as_str().expect("variable name").to_string())
        .collect();

    let references = variable_references(&text);
    for name in &references {
        if !variable_names.contains(name) && !input_names.contains(name) {
            problems.push(format!("${name} is neither a templating variable nor an input"));
        }
    }
    for name in &input_names {
        if !references.contains(name) {
            problems.push(format!("input {name} is asked for on import and used nowhere"));
        }
    }

    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty(), "no panels");
    let mut ids = HashSet::new();
    let mut placed: Vec<(String, [i64; 4])> = Vec::new();
    let mut used = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        let at = format!("panel {:?} ({})", title, panel["id"]);
        if title.is_empty() {
            problems.push(format!("{at}: no title"));
        }
        match panel["id"].as_i64() {
            Some(id) if !ids.insert(id) => problems.push(format!("{at}: id {id} twice")),
            Some(_) => {}
            None => problems.push(format!("{at}: no numeric id")),
        }
        match panel["type"].as_str() {
            Some("timeseries" | "stat" | "table") => {}
            other => problems.push(format!("{at}: type {other:?}, not timeseries, stat or table")),
        }
        if panel["datasource"]["uid"] != "${datasource}" {
            problems.push(format!(
                "{at}: datasource {} is not ${{datasource}}",
                panel["datasource"]
            ));
        }

        let grid = &panel["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|key| grid[key].as_i64().unwrap_or(-1));
        if x < 0 || y < 0 || w < 1 || h < 1 || x + w > GRID_COLUMNS {
            problems.push(format!(
                "{at}: gridPos {grid} is not within a {GRID_COLUMNS}-column grid"
            ));
        } else {
            for (other, [ox, oy, ow, oh]) in &placed {
                if x < ox + ow && *ox < x + w && y < oy + oh && *oy < y + h {
                    problems.push(format!("{at}: gridPos {grid} overlaps panel {other:?}"));
                }
            }
            placed.push((title.clone(), [x, y, w, h]));
        }

        let targets = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("{at}: no targets"));
        }
        let mut ref_ids = HashSet::new();
        for target in targets {
            match target["refId"].as_str() {
                Some(ref_id) if !ref_id.is_empty() && ref_ids.insert(ref_id) => {}
                other => problems.push(format!("{at}: refId {other:?} missing or twice")),
            }
            if target.get("datasource").is_some_and(|ds| ds["uid"] != "${datasource}") {
                problems.push(format!("{at}: a target's datasource is not ${{datasource}}"));
            }
            let expr = target["expr"].as_str().unwrap_or_default();
            let names = metric_names(expr);
            if names.is_empty() {
                problems.push(format!("{at}: expr {expr:?} queries no shardcron_ metric"));
            }
            for name in unknown(&names) {
                problems.push(format!(
                    "{at}: {name} is not in KNOWN_METRICS (a histogram is queried through _bucket, _count or _sum)"
                ));
            }
            used.extend(names.iter().filter_map(|name| known_as(name)));
        }
    }

    // The dashboard shows everything a node exports.
    for name in KNOWN_METRICS {
        if !used.contains(name) {
            problems.push(format!("no panel shows {name}"));
        }
    }

    // The alerts' metrics are exported too (their own tests run promtool).
    let alert_names = metric_names(&read(ALERTS));
    for name in unknown(&alert_names) {
        problems.push(format!("{ALERTS}: {name} is not in KNOWN_METRICS"));
    }

    assert!(problems.is_empty(), "{DASHBOARD}:\n{}", problems.join("\n"));
}

/// Every panel's query, with Grafana's variables given values, as a recording rule: `promtool
/// check rules` then parses it as PromQL.
#[test]
fn grafana_queries_parse_as_promql() {
    let (_, dashboard) = dashboard();
    let mut rules = String::from("groups:\n  - name: shardcron_dashboard\n    rules:\n");
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            let mut promql = expr.to_string();
            for (variable, value) in [
                ("$__rate_interval", "5m"),
                ("$__interval", "1m"),
                ("$__range", "6h"),
                ("${job}", ".*"),
                ("$job", ".*"),
            ] {
                promql = promql.replace(variable, value);
            }
            assert!(!promql.contains('$'), "a variable left in {expr:?}");
            rules.push_str(&format!(
                "      - record: dashboard:panel{}_{}\n        expr: {}\n",
                panel["id"],
                target["refId"].as_str().expect("refId"),
                // A JSON string is a YAML double-quoted scalar.
                serde_json::to_string(&promql).expect("string")
            ));
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("dashboard_rules.yml");
    std::fs::write(&file, &rules).expect("write the rules");
    let out = promtool(&["check", "rules", file.to_str().expect("path")]);
    assert!(out.contains("SUCCESS"), "{out}\n{rules}");
}
