//! What the jobs recorded: a line per run in the world's runs file, read back as [`Run`]s, and
//! the checks scenarios make on them.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use chrono::{DateTime, Utc};

/// One recorded run.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub job: String,
    pub tick: DateTime<Utc>,
    /// `CRON_FENCE`: the revision of the claim that won the tick.
    pub fence: i64,
    /// `CRON_TERM`: the term of the leadership that claimed it; 0 where the command did not
    /// record it.
    pub term: i64,
    pub node: String,
    pub shard: u32,
    /// The job's own clock when it started, seconds since the epoch.
    pub started: f64,
    /// `CRON_REDELIVERED` was set: an earlier leader claimed this tick and never recorded its
    /// start.
    pub redelivered: bool,
}

impl Run {
    pub fn lateness(&self) -> f64 {
        self.started - self.tick.timestamp() as f64 - f64::from(self.tick.timestamp_subsec_nanos()) / 1e9
    }
}

pub fn read_runs(path: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            // Some commands record only the first six fields.
            let (fields, redelivered, term) = match parts.as_slice() {
                [fields @ .., redelivered, term] if parts.len() == 8 => {
                    (fields, *redelivered == "1", term.parse().ok()?)
                }
                fields => (fields, false, 0),
            };
            let [job, tick, fence, node, shard, started] = fields else {
                return None;
            };
            Some(Run {
                job: job.to_string(),
                tick: DateTime::parse_from_rfc3339(tick).ok()?.with_timezone(&Utc),
                fence: fence.parse().ok()?,
                term,
                node: node.to_string(),
                shard: shard.parse().ok()?,
                started: started.parse().ok()?,
                redelivered,
            })
        })
        .collect()
}

/// Asserts every tick of `job` from its first to its last recorded run appears exactly once,
/// on whole seconds `step` apart, and returns the ticks.
pub fn assert_each_tick_once(runs: &[Run], job: &str, step_secs: i64) -> Vec<DateTime<Utc>> {
    let mut ticks: Vec<DateTime<Utc>> = runs.iter().filter(|run| run.job == job).map(|run| run.tick).collect();
    ticks.sort();
    let mut seen = HashSet::new();
    for tick in &ticks {
        assert!(seen.insert(*tick), "tick {tick} of {job} ran more than once: {runs:#?}");
    }
    for pair in ticks.windows(2) {
        assert_eq!(
            (pair[1] - pair[0]).num_seconds(),
            step_secs,
            "tick missing between {} and {} of {job}",
            pair[0],
            pair[1]
        );
    }
    ticks
}

/// Asserts the at-least-once contract for `job` from its first to its last recorded tick, on
/// whole seconds `step_secs` apart: every tick ran, and a tick ran again only as a redelivery
/// (`CRON_REDELIVERED=1`) with a higher fence than the run before it. A SIGKILL between a run's
/// start and the write that records it allows such a repeat; nothing else does. Returns how many
/// repeats there were.
pub fn assert_each_tick_at_least_once(runs: &[Run], job: &str, step_secs: i64) -> usize {
    let mut ran: Vec<&Run> = runs.iter().filter(|run| run.job == job).collect();
    ran.sort_by(|a, b| {
        (a.tick, a.started)
            .partial_cmp(&(b.tick, b.started))
            .expect("start times are numbers")
    });
    let mut repeats = 0;
    for pair in ran.windows(2) {
        let gap = (pair[1].tick - pair[0].tick).num_seconds();
        if gap == 0 {
            repeats += 1;
            assert!(
                pair[1].fence > pair[0].fence && pair[1].redelivered,
                "tick {} of {job} ran again without a higher fence and CRON_REDELIVERED: {:#?}",
                pair[0].tick,
                (pair[0], pair[1])
            );
        } else {
            assert_eq!(
                gap, step_secs,
                "tick missing between {} and {} of {job}",
                pair[0].tick, pair[1].tick
            );
        }
    }
    repeats
}

/// Whether each of `names` has started at least `times` runs after `since`.
pub fn every_job_ran_since(runs: &[Run], names: &[String], since: f64, times: usize) -> bool {
    names.iter().all(|name| {
        runs.iter()
            .filter(|run| &run.job == name && run.started > since)
            .count()
            >= times
    })
}

/// Whether every job has run a tick scheduled after `instant`: live ticks, not catch-up runs.
pub fn every_job_ran_a_tick_after(runs: &[Run], names: &[String], instant: f64) -> bool {
    names.iter().all(|name| {
        runs.iter()
            .any(|run| &run.job == name && run.tick.timestamp() as f64 > instant)
    })
}

/// When `node` first started a run after `after`.
pub fn first_start_after(runs: &[Run], node: &str, after: f64) -> f64 {
    runs.iter()
        .filter(|run| run.node == node && run.started > after)
        .map(|run| run.started)
        .fold(f64::MAX, f64::min)
}

/// Asserts no run started in `term` after `takeover`: a stale leader's run after its successor
/// took over.
pub fn assert_no_run_of_term_after(runs: &[Run], term: i64, takeover: f64) {
    let stale: Vec<&Run> = runs
        .iter()
        .filter(|run| run.term == term && run.started > takeover)
        .collect();
    assert!(
        stale.is_empty(),
        "runs in the old leader's term {term} after the takeover: {stale:#?}"
    );
}

/// Asserts that, per job, in the order runs started, no run started with a lower fence than
/// one that started before it: no stale leader starts a run after a newer leader did.
pub fn assert_fences_never_go_down(runs: &[Run]) {
    let mut by_start: Vec<&Run> = runs.iter().collect();
    by_start.sort_by(|a, b| a.started.total_cmp(&b.started));
    let mut highest: std::collections::HashMap<&str, &Run> = std::collections::HashMap::new();
    for run in by_start {
        if let Some(before) = highest.get(run.job.as_str()) {
            assert!(
                run.fence >= before.fence,
                "{}: a run with fence {} started after one with fence {}: {run:#?} after {before:#?}",
                run.job,
                run.fence,
                before.fence
            );
        }
        let newest = highest.entry(run.job.as_str()).or_insert(run);
        if run.fence > newest.fence {
            *newest = run;
        }
    }
}

/// The term of the newest run: the leadership running the jobs now.
pub fn newest_term(runs: &[Run]) -> i64 {
    runs.iter()
        .max_by(|a, b| a.started.total_cmp(&b.started))
        .map(|run| run.term)
        .expect("runs")
}

/// The runs of each tick of `job`, in the order they started.
pub fn by_tick(runs: &[Run], job: &str) -> BTreeMap<DateTime<Utc>, Vec<Run>> {
    let mut ticks: BTreeMap<DateTime<Utc>, Vec<Run>> = BTreeMap::new();
    for run in runs.iter().filter(|run| run.job == job) {
        ticks.entry(run.tick).or_default().push(run.clone());
    }
    for runs in ticks.values_mut() {
        runs.sort_by(|a, b| a.started.total_cmp(&b.started));
    }
    ticks
}

/// Whether node `logs` record `tick` of `job` lost (the tick in RFC 3339, as every log line
/// prints one).
pub fn recorded_lost(logs: &str, job: &str, tick: DateTime<Utc>) -> bool {
    let tick = tick.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    logs.lines().any(|line| {
        line.contains("lost:") && line.contains(&format!("job={job} ")) && line.contains(&format!("tick={tick}"))
    })
}

/// The most runs going at one moment, from each run's (start, end) by the jobs' own clocks. An
/// end before a start at the same instant: a run that ends frees its place first.
pub fn most_at_once(spans: impl IntoIterator<Item = (f64, f64)>) -> usize {
    let mut edges: Vec<(f64, i32)> = spans
        .into_iter()
        .flat_map(|(started, ended)| [(started, 1), (ended, -1)])
        .collect();
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut going, mut most) = (0i32, 0i32);
    for (_, change) in edges {
        going += change;
        most = most.max(going);
    }
    most as usize
}
