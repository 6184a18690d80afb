//! The dashboard in a real browser (headless chromium over WebDriver) against a real node and
//! etcd: it shows the fleet and the jobs, and its trigger button runs a job.
//!
//! Screenshots are saved in the test's temp dir, and also in `$SHARDCRON_SCREENSHOTS` when set
//! (how the README's picture is taken).

use std::path::PathBuf;
use std::time::Duration;

use crate::support::browser::Browser;
use crate::support::*;

const TOKEN_VAR: &str = "SHARDCRON_TEST_API_TOKEN";
const TOKEN: &str = "dashboard-test-token";

fn save(browser: &Browser, world: &World, name: &str) -> PathBuf {
    let path = world.dir.path().join(name);
    browser.screenshot(&path);
    if let Some(dir) = std::env::var_os("SHARDCRON_SCREENSHOTS") {
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        std::fs::copy(&path, PathBuf::from(dir).join(name)).expect("copy the screenshot");
    }
    println!("screenshot: {}", path.display());
    path
}

#[test]
fn the_dashboard_shows_the_fleet_and_its_trigger_button_runs_a_job() {
    let mut world = World::new();
    let config = world.write_config(
        "jobs.toml",
        4,
        2,
        &[
            ("heartbeat", "*/2 * * * * *", "group = \"db\""),
            ("nightly-backup", "30 2 * * *", "timezone = \"Europe/Berlin\""),
            ("hourly-report", "H * * * *", ""),
            // Only ever runs when asked: its last run is the one the button asked for.
            ("yearly-cleanup", "0 0 1 1 *", ""),
            // No node has the gpu tag: nobody may run it.
            ("train-model", "0 3 * * *", "run_on = [\"gpu\"]"),
        ],
    );
    let text = std::fs::read_to_string(&config).expect("config");
    let text = text.replacen("\n\n[etcd]", "\npool_shards = 1\n\n[etcd]", 1);
    std::fs::write(&config, format!("{text}\n[groups.db]\nlimit = 1\nwait = \"30s\"\n")).expect("config");
    let port = shardcron::etcd_server::free_port().expect("port");
    world
        .node("node-a", &config)
        .args(&[
            "--http-addr",
            &port.to_string(),
            "--api-token-env",
            TOKEN_VAR,
            "--tags",
            "web,eu-west",
        ])
        .env(&[(TOKEN_VAR, TOKEN)])
        .start();
    world.node("node-b", &config).start();
    wait_ready_within(port, Duration::from_secs(30));
    wait_for(Duration::from_secs(30), "both nodes lead the fleet's shards", || {
        let status = world.status(&config);
        status.nodes.len() == 2
            && status
                .shards
                .iter()
                .all(|shard| shard.leader.is_some() || shard.pool.is_some())
    });

    let browser = Browser::start(1400, 1000);
    browser.open(&format!("http://127.0.0.1:{port}/"));
    browser.wait_for_element("[data-job=\"yearly-cleanup\"]", Duration::from_secs(20));
    let nodes = browser.wait_for_text("#nodes", "both nodes listed", Duration::from_secs(10), |text| {
        text.contains("node-a") && text.contains("node-b")
    });
    assert!(!nodes.is_empty());
    let jobs = browser.text("#jobs");
    for shown in [
        "heartbeat",
        "nightly-backup",
        "hourly-report",
        "yearly-cleanup",
        "Europe/Berlin",
        "30 2 * * *",
    ] {
        assert!(jobs.contains(shown), "{shown} not shown in the jobs table:\n{jobs}");
    }
    browser.wait_for_text(
        "[data-job=\"heartbeat\"] .last-run",
        "heartbeat's last run shown",
        Duration::from_secs(10),
        |text| text.contains("success"),
    );
    step("the fleet strip: the last hour's runs per minute, by outcome");
    browser.wait_for_element("#strip .bar[data-kind=\"success\"]", Duration::from_secs(40));
    let bars = browser.script(
        "return [...document.querySelectorAll('#strip .bar')].map((b) => [b.dataset.kind, Number(b.dataset.count), b.getAttribute('fill')]);",
    );
    let bars: Vec<(String, u64, String)> = serde_json::from_value(bars).expect("bars");
    for (kind, _, fill) in &bars {
        let wanted = match kind.as_str() {
            "success" => "#2e9d5b",
            "failure" => "#d1453b",
            "held" => "#d9a21b",
            _ => "#7b3fb5",
        };
        assert_eq!(fill, wanted, "a {kind} bar");
    }
    let drawn: u64 = bars.iter().map(|(_, count, _)| count).sum();
    let activity: serde_json::Value =
        serde_json::from_str(&http_get(port, "/api/v1/activity").1).expect("activity JSON");
    let counted: u64 = activity["minutes"]
        .as_array()
        .expect("minutes")
        .iter()
        .map(|minute| {
            ["success", "failure", "held", "lost"]
                .iter()
                .filter_map(|kind| minute[kind].as_u64())
                .sum::<u64>()
        })
        .sum();
    assert!(
        drawn > 0 && drawn <= counted,
        "the strip drew {drawn} runs, the API counts {counted}"
    );
    let shards = browser.text("#shards");
    assert!(shards.contains("node-a") || shards.contains("node-b"), "{shards}");
    assert!(nodes.contains("eu-west"), "node-a's tags not shown:\n{nodes}");
    browser.wait_for_text(
        "#shards",
        "the gpu pool's shard shown without an eligible node",
        Duration::from_secs(10),
        |text| text.contains("gpu") && text.contains("no eligible node"),
    );
    browser.wait_for_text(
        "[data-job=\"train-model\"] .name",
        "train-model shown without an eligible node",
        Duration::from_secs(10),
        |text| text.contains("pool gpu") && text.contains("no eligible node"),
    );

    let groups = browser.wait_for_text("#groups", "the db group shown", Duration::from_secs(10), |text| {
        text.contains("db") && text.contains("waits 30s")
    });
    assert!(groups.contains('1'), "the group's limit not shown:\n{groups}");
    let heartbeat = browser.text("[data-job=\"heartbeat\"] .name");
    assert!(
        heartbeat.contains("group db"),
        "heartbeat's group not shown: {heartbeat}"
    );

    browser.click("[data-job=\"yearly-cleanup\"] button[data-action=\"trigger\"]");
    // The token is asked for once, in the page's own dialog.
    browser.type_into("#token-input", TOKEN);
    browser.click("#token-save");
    browser.wait_for_text(
        "#message",
        "the page says the run was taken",
        Duration::from_secs(20),
        |text| text.contains("yearly-cleanup"),
    );
    let last_run = browser.wait_for_text(
        "[data-job=\"yearly-cleanup\"] .last-run",
        "the requested run appears",
        Duration::from_secs(20),
        |text| text.contains("manual"),
    );
    assert!(last_run.contains("success"), "{last_run}");
    let ran = world.runs().iter().filter(|run| run.job == "yearly-cleanup").count();
    assert_eq!(ran, 1, "the button ran the job once");
    browser.script("window.scrollTo(0, 0); return true;");
    save(&browser, &world, "dashboard-wide.png");

    browser.resize(390, 844);
    let fits = browser.script("return document.documentElement.scrollWidth <= window.innerWidth + 1;");
    assert_eq!(
        fits,
        serde_json::Value::Bool(true),
        "the page fits a phone's width without scrolling sideways"
    );
    browser.wait_for_element("[data-job=\"heartbeat\"]", Duration::from_secs(5));
    save(&browser, &world, "dashboard-narrow.png");
}

/// The page reads one page of jobs at a time and sends its filter to the node: with thousands
/// of jobs it never holds them all.
#[test]
fn the_dashboard_pages_its_jobs_and_the_node_applies_the_filter() {
    let mut world = World::new();
    let names = job_names(250, 5);
    // Yearly: nothing runs while the test looks.
    let jobs: Vec<(&str, &str, &str)> = names.iter().map(|name| (name.as_str(), "0 0 1 1 *", "")).collect();
    let config = world.write_config("jobs.toml", 2, 2, &jobs);
    let port = world.node("node-a", &config).start_serving();

    let browser = Browser::start(1400, 1000);
    browser.open(&format!("http://127.0.0.1:{port}/"));
    browser.wait_for_element("[data-job=\"job00000\"]", Duration::from_secs(20));
    let rows = || browser.script("return document.querySelectorAll('#jobs tbody tr').length;");
    assert_eq!(rows(), serde_json::json!(100), "one page of 100 jobs");
    browser.wait_for_text(".pager", "the pager shows 3 pages", Duration::from_secs(5), |text| {
        text.contains("page 1 of 3")
    });

    step("the next page");
    browser.click("#page-next");
    browser.wait_for_element("[data-job=\"job00100\"]", Duration::from_secs(10));
    assert_eq!(
        browser.text("[data-job=\"job00000\"]"),
        "",
        "the first page's rows are gone"
    );

    step("the filter goes to the node");
    browser.type_into("#job-filter", "JOB0024");
    browser.wait_for_text("#job-count", "ten jobs match", Duration::from_secs(10), |text| {
        text.contains("10 of 250 match")
    });
    assert_eq!(rows(), serde_json::json!(10));
    browser.wait_for_element("[data-job=\"job00249\"]", Duration::from_secs(5));
    let asked = browser.script(
        "return performance.getEntriesByType('resource').map((e) => e.name).filter((n) => n.includes('api/v1/jobs?'));",
    );
    assert!(
        asked.as_array().is_some_and(|urls| urls
            .iter()
            .any(|url| url.as_str().is_some_and(|url| url.contains("filter=JOB0024")))),
        "the page asked the node for the filtered jobs: {asked}"
    );
    assert!(
        !asked.to_string().contains("per_page=1000"),
        "never more than a page: {asked}"
    );
}

/// A job's page, reached from the jobs table: its facts, next fire times, a timeline with one
/// mark per run coloured by outcome (a skipped tick drawn too), the history table and a run's
/// output on demand.
#[test]
fn a_jobs_page_draws_its_runs_and_shows_their_output() {
    let mut world = World::new();
    // Fails every other tick (by its own clock), so the timeline has both colours.
    let flaky = r#"echo "run $CRON_FENCE at $CRON_SCHEDULED_AT"; test $(( $(date +%s) / 2 % 2 )) -eq 0"#;
    let tables = [
        ("flaky", format!("schedule = \"*/2 * * * * *\"\ncommand = '{flaky}'")),
        ("slow", "schedule = \"*/2 * * * * *\"\ncommand = 'sleep 3'".to_string()),
        (
            "frozen",
            "schedule = \"*/2 * * * * *\"\ncommand = 'true'\nblackouts = [\"holidays\"]\nnotify = [\"hook\"]"
                .to_string(),
        ),
    ];
    let config = world.write_config_tables("jobs.toml", 1, 2, &tables);
    // Today and tomorrow, whole days in UTC: the blackout holds for the whole test.
    let receiver = crate::support::receiver::Receiver::start();
    let today = chrono::Utc::now().date_naive();
    let blackout_and_hook = format!(
        "[blackouts.holidays]\ndates = [\"{today}\", \"{}\"]\n\n[notify.hook]\nurl = \"{}\"\non = [\"skipped\"]\n",
        today.succ_opt().expect("tomorrow"),
        receiver.url("/hook")
    );
    std::fs::write(
        &config,
        std::fs::read_to_string(&config).expect("config") + &blackout_and_hook,
    )
    .expect("config");
    let port = world.node("node-a", &config).start_serving();
    let history = |job: &str| -> Vec<shardcron::rules::record::RunRecord> {
        serde_json::from_str(&http_get(port, &format!("/api/v1/jobs/{job}/history?count=100")).1).unwrap_or_default()
    };
    wait_for(
        Duration::from_secs(60),
        "flaky failed and succeeded, slow skipped a tick",
        || {
            let runs = history("flaky");
            let exits: Vec<Option<i32>> = runs.iter().map(|run| run.exit_code).collect();
            runs.len() >= 6
                && exits.contains(&Some(0))
                && exits.contains(&Some(1))
                && history("slow").iter().any(|run| run.outcome.to_string() == "skipped")
        },
    );

    let browser = Browser::start(1400, 1000);
    browser.open(&format!("http://127.0.0.1:{port}/"));
    browser.wait_for_element("[data-job=\"flaky\"] a", Duration::from_secs(20));
    browser.click("[data-job=\"flaky\"] a");
    browser.wait_for_text("#job-name", "the job's page", Duration::from_secs(10), |text| {
        text == "flaky"
    });
    let facts = browser.wait_for_text("#facts", "the job's facts", Duration::from_secs(10), |text| {
        text.contains("*/2 * * * * *") && text.contains("node-a")
    });
    assert!(facts.contains("UTC"), "{facts}");
    let next = browser.script("return document.querySelectorAll('#next tbody tr').length;");
    assert_eq!(next, serde_json::json!(5), "the next five fire times");

    step("one mark per run, coloured by outcome");
    browser.wait_for_element("#timeline .mark", Duration::from_secs(10));
    let marks_of = || -> Vec<(String, String)> {
        let marks = browser.script(
            "return [...document.querySelectorAll('#timeline .mark')].map((m) => [m.dataset.tick, m.getAttribute('fill')]);",
        );
        serde_json::from_value(marks).expect("marks")
    };
    let marks = marks_of();
    let runs = history("flaky");
    assert!(
        marks.len() >= 6 && marks.len() + 2 >= runs.len(),
        "{} marks for {} runs",
        marks.len(),
        runs.len()
    );
    for (tick, fill) in &marks {
        let run = runs
            .iter()
            .find(|run| run.scheduled_at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true) == *tick)
            .unwrap_or_else(|| panic!("a mark at {tick} that the history does not hold"));
        let wanted = if run.exit_code == Some(0) { "#2e9d5b" } else { "#d1453b" };
        assert_eq!(fill, wanted, "the mark of {tick} ({:?})", run.exit_code);
    }
    let rows = browser.script("return document.querySelectorAll('#history tbody tr').length;");
    assert!(rows.as_u64().is_some_and(|rows| rows >= 6), "history rows: {rows}");

    step("a run's output, on demand");
    browser.click("#history button[data-output]");
    let output = browser.wait_for_text(
        "#history tr.output",
        "the run's output",
        Duration::from_secs(10),
        |text| text.contains("run "),
    );
    assert!(output.contains("stdout"), "{output}");
    save(&browser, &world, "job-page-wide.png");

    step("a skipped tick is drawn");
    browser.open(&format!("http://127.0.0.1:{port}/jobs/slow"));
    browser.wait_for_element("#timeline .mark[data-outcome=\"skipped\"]", Duration::from_secs(10));
    let fill = browser
        .script("return document.querySelector('#timeline .mark[data-outcome=\"skipped\"]').getAttribute('fill');");
    assert_eq!(fill, serde_json::json!("#d9a21b"));

    step("a backfill's progress on the job's page");
    let to = chrono::Utc::now() - chrono::Duration::minutes(1);
    let from = to - chrono::Duration::seconds(10);
    let asked = std::process::Command::new(SHARDCRON)
        .args([
            "backfill",
            "slow",
            "--detach",
            "--from",
            &from.to_rfc3339(),
            "--to",
            &to.to_rfc3339(),
            "--config",
        ])
        .arg(&config)
        .output()
        .expect("backfill");
    assert!(asked.status.success(), "{}", String::from_utf8_lossy(&asked.stderr));
    browser.open(&format!("http://127.0.0.1:{port}/jobs/slow"));
    let facts = browser.wait_for_text("#facts", "the backfill's progress", Duration::from_secs(15), |text| {
        text.contains("Backfill")
    });
    // Its runs of 3 s wait for the live ones, so it is still going.
    assert!(facts.contains("/5 done") && facts.contains("going"), "{facts}");
    let record = world.status(&config).backfills;
    let done = record
        .first()
        .map(|entry| entry.backfill.done)
        .expect("slow's backfill");
    let bar = browser.script("const p = document.querySelector('#backfill-progress'); return p.max;");
    assert_eq!(bar, serde_json::json!(5));
    assert!(done < 5, "{done}");

    step("a job in a blackout: the blackout in force, its skipped ticks, the last notification told");
    browser.open(&format!("http://127.0.0.1:{port}/jobs/frozen"));
    let facts = browser.wait_for_text(
        "#facts",
        "the blackout and the notification",
        Duration::from_secs(30),
        |text| text.contains("skipped delivered"),
    );
    assert!(facts.contains("in holidays now"), "{facts}");
    let chips = browser.text("#summary");
    assert!(chips.contains("blackout holidays"), "{chips}");
    let notes = browser.text("#next");
    assert!(
        notes.contains("blackout holidays"),
        "the next fire times say why they will not run: {notes}"
    );
    assert!(
        !receiver.hits_on("/hook").is_empty()
            && history("frozen")
                .iter()
                .all(|run| run.blackout.as_deref() == Some("holidays")),
        "every tick of frozen skipped in the blackout"
    );
    save(&browser, &world, "job-page-blackout.png");

    browser.open(&format!("http://127.0.0.1:{port}/jobs/flaky"));
    browser.resize(390, 844);
    browser.wait_for_element("#timeline .mark", Duration::from_secs(10));
    let fits = browser.script("return document.documentElement.scrollWidth <= window.innerWidth + 1;");
    assert_eq!(
        fits,
        serde_json::Value::Bool(true),
        "the job's page fits a phone's width"
    );
    save(&browser, &world, "job-page-narrow.png");
}
