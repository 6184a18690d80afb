//! The feature checkers of the randomized fault run, over the whole run, from the jobs' own
//! stamps (see the parent module), the receiver's requests and etcd's keys at the end.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{stamps_of, Features, Stamped, Timeline, GROUPS, QUIET, RESOLUTION};
use crate::support::*;

/// Violations of one kind: how many, and the first few.
#[derive(Default, Debug)]
pub struct Found {
    pub count: usize,
    pub first: Vec<String>,
}

impl Found {
    fn note(&mut self, what: String) {
        self.count += 1;
        if self.first.len() < 5 {
            self.first.push(what);
        }
    }
}

/// Every feature checker's violations, by name, and what each looked at.
#[derive(Default, Debug)]
pub struct Verdict {
    pub found: BTreeMap<&'static str, Found>,
    pub looked_at: BTreeMap<&'static str, usize>,
}

impl Verdict {
    fn note(&mut self, checker: &'static str, what: String) {
        self.found.entry(checker).or_default().note(what);
    }

    fn looked(&mut self, checker: &'static str) {
        self.found.entry(checker).or_default();
        *self.looked_at.entry(checker).or_default() += 1;
    }

    pub fn violations(&self) -> usize {
        self.found.values().map(|found| found.count).sum()
    }

    /// `checker: looked at N, violations V` for each checker.
    pub fn figures(&self) -> String {
        self.found
            .iter()
            .map(|(name, found)| {
                format!(
                    "{name}: {} checked, {} violations",
                    self.looked_at.get(name).copied().unwrap_or(0),
                    found.count
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// How long after its node's SIGKILL a command spawned just before it may stamp its start: the
/// fork and exec were under way as the kill landed. The test starts a killed node again no
/// sooner than 500 ms after the kill, so no start of that node's own comes this soon.
const SPAWN_IN_FLIGHT: f64 = 0.5;

/// Whether `run` is outside what the limits promise at `at`: its node was frozen (SIGSTOP) at
/// some time between its start and `at`, or killed outright (SIGKILL) while it went, which
/// orphans the command (docs/config.md, "How many run at once", and the frozen-node case of
/// overlap).
fn exempt(timeline: &Timeline, run: &Stamped, at: f64) -> bool {
    let frozen = timeline
        .stops
        .iter()
        .any(|(node, from, to)| *node == run.node && *from <= at && *to >= run.started);
    let orphaned = timeline
        .kills
        .iter()
        .any(|(node, killed)| *node == run.node && *killed + SPAWN_IN_FLIGHT >= run.started && *killed <= run.end());
    frozen || orphaned
}

/// Whether `earlier` still went when `later` started, beyond the stamps' resolution.
fn beside(earlier: &Stamped, later: &Stamped) -> bool {
    earlier.started <= later.started && later.started < earlier.end() - RESOLUTION
}

fn describe(run: &Stamped) -> String {
    format!(
        "{} {} run of {} (fence {}, redelivered {}) on {} from {:.3} to {}",
        run.job,
        run.trigger,
        run.tick,
        run.fence,
        run.redelivered,
        run.node,
        run.started,
        run.ended.map_or("-".into(), |at| format!("{at:.3}"))
    )
}

/// The limit of `group` at `at`: `one` is always 1; `three` is the limit of the last reload that
/// landed on every node, and while one lands, the higher of its two. A reload lands once every
/// node logged it and a second more passed: a node's terms take the new jobs between ticks.
fn limit_at(timeline: &Timeline, group: &str, at: f64) -> u32 {
    if group == "one" {
        return 1;
    }
    let mut limit = 3;
    for (sent, logged, before, after) in &timeline.reloads {
        let landed = logged + 1.0;
        if at >= *sent && at <= landed {
            return (*before).max(*after);
        }
        if at > landed {
            limit = *after;
        }
    }
    limit
}

pub fn check(features: &Features) -> Verdict {
    let mut verdict = Verdict::default();
    let (dir, timeline) = (&features.dir, &features.timeline);

    // No two runs of a skip or replace job at once.
    for job in ["skip0", "repl0"] {
        let mut runs = stamps_of(dir, job);
        runs.sort_by(|a, b| a.started.total_cmp(&b.started));
        for (index, later) in runs.iter().enumerate() {
            verdict.looked("overlap");
            if let Some(earlier) = runs[..index]
                .iter()
                .find(|earlier| beside(earlier, later) && !exempt(timeline, earlier, later.started))
            {
                verdict.note(
                    "overlap",
                    format!(
                        "{} started beside the {} (their nodes on {} and {} shards)",
                        describe(later),
                        describe(earlier),
                        timeline.shards_of(&later.node, later.started),
                        timeline.shards_of(&earlier.node, later.started)
                    ),
                );
            }
        }
    }

    // Never more than a group's limit at once, counted at each start.
    for (group, jobs) in GROUPS {
        let runs: Vec<Stamped> = jobs.iter().flat_map(|job| stamps_of(dir, job)).collect();
        for later in &runs {
            verdict.looked("group limit");
            let going: Vec<&Stamped> = runs
                .iter()
                .filter(|earlier| {
                    !std::ptr::eq(*earlier, later)
                        && beside(earlier, later)
                        && !exempt(timeline, earlier, later.started)
                })
                .collect();
            let limit = limit_at(timeline, group, later.started);
            if going.len() + 1 > limit as usize {
                verdict.note(
                    "group limit",
                    format!(
                        "group {group} (limit {limit}): {} started while {} went: {}",
                        describe(later),
                        going.len(),
                        going.iter().map(|run| describe(run)).collect::<Vec<_>>().join("; ")
                    ),
                );
            }
        }
    }

    // Every backfill tick run once, or again flagged redelivered with a higher fence.
    for (job, ticks) in &timeline.backfills {
        let runs = stamps_of(dir, job);
        for tick in ticks {
            verdict.looked("backfill");
            let mut ran: Vec<&Stamped> = runs
                .iter()
                .filter(|run| run.trigger == "backfill" && run.tick == *tick)
                .collect();
            ran.sort_by(|a, b| a.started.total_cmp(&b.started));
            if ran.is_empty() {
                verdict.note("backfill", format!("{job}: backfill tick {tick} never ran"));
            }
            for pair in ran.windows(2) {
                if !(pair[1].redelivered && pair[1].fence > pair[0].fence) {
                    verdict.note(
                        "backfill",
                        format!(
                            "{job}: backfill tick {tick} ran again without a higher fence and CRON_REDELIVERED: {} after {}",
                            describe(pair[1]),
                            describe(pair[0])
                        ),
                    );
                }
            }
        }
    }

    // No scheduled or backfill run of a tick inside the blackout (it opens every 20 s for 5 s).
    for job in QUIET {
        for run in stamps_of(dir, job) {
            verdict.looked("blackout");
            if run.trigger != "manual" && run.tick.timestamp() % 20 < 5 {
                verdict.note("blackout", format!("{} is inside the blackout", describe(&run)));
            }
        }
    }

    // No scheduled run of `pooled` of a tick that came while it was paused (2 s after `pause`
    // answered, for its watch to reach the leader), nor of it off its pool.
    for run in stamps_of(dir, "pooled") {
        verdict.looked("pause and pool");
        let tick = run.tick.timestamp() as f64;
        if run.trigger == "schedule" && timeline.pauses.iter().any(|(from, to)| tick > from + 2.0 && tick < *to) {
            verdict.note("pause and pool", format!("{} ran while paused", describe(&run)));
        }
        if run.node == "c" {
            verdict.note("pause and pool", format!("{} ran off its pool", describe(&run)));
        }
    }

    // Each node's instance of the fanned-out job runs a tick again only redelivered, fenced
    // higher.
    let mut by_instance: BTreeMap<(String, String, i64), Vec<Stamped>> = BTreeMap::new();
    for run in stamps_of(dir, "fanned") {
        verdict.looked("fan-out");
        by_instance
            .entry((run.node.clone(), run.trigger.clone(), run.tick.timestamp_millis()))
            .or_default()
            .push(run);
    }
    for ran in by_instance.values_mut() {
        ran.sort_by(|a, b| a.started.total_cmp(&b.started));
        for pair in ran.windows(2) {
            if !(pair[1].redelivered && pair[1].fence > pair[0].fence) {
                verdict.note(
                    "fan-out",
                    format!("{} after {}", describe(&pair[1]), describe(&pair[0])),
                );
            }
        }
    }

    notifications(features, &mut verdict);
    verdict
}

/// Transitions of `told` that its stamps prove: two runs next to each other both in the order
/// they ended (at least the stamps' resolution apart from every neighbour) and by fence, each
/// ended by itself with a code, neither on a node SIGKILLed before it could account the run;
/// a success then a failure is a `failure` of the second, the reverse a `recovered`.
fn proven_transitions(features: &Features) -> Vec<(String, Stamped)> {
    let mut runs = stamps_of(&features.dir, "told");
    runs.retain(|run| run.ended.is_some());
    runs.sort_by(|a, b| a.end().total_cmp(&b.end()));
    let killed_near = |run: &Stamped| {
        features
            .timeline
            .kills
            .iter()
            .any(|(node, at)| *node == run.node && *at >= run.started - 1.0 && *at <= run.end() + 3.0)
    };
    let mut proven = Vec::new();
    for index in 1..runs.len() {
        let (a, b) = (&runs[index - 1], &runs[index]);
        let apart_before = index < 2 || runs[index - 2].end() + RESOLUTION < a.end();
        let apart_after = index + 1 >= runs.len() || b.end() + RESOLUTION < runs[index + 1].end();
        if !(apart_before && apart_after && a.end() + RESOLUTION < b.end() && a.fence < b.fence) {
            continue;
        }
        if killed_near(a) || killed_near(b) {
            continue;
        }
        match (a.code, b.code) {
            (Some(0), Some(code)) if code != 0 => proven.push(("failure".to_string(), b.clone())),
            (Some(code), Some(0)) if code != 0 => proven.push(("recovered".to_string(), b.clone())),
            _ => {}
        }
    }
    proven
}

/// Every proven transition told at least once (waiting up to 90 s for retries), every repeat of
/// an event with the same `dedupe_key`, and a backfill's key never the one the scheduled run of
/// the same tick and event carries.
fn notifications(features: &Features, verdict: &mut Verdict) {
    let proven = proven_transitions(features);
    // Runs are accounted in fence order: one whose accounting lands after a later run's is not
    // counted, and the later run carries the transition (docs/config.md). So the transition is
    // told by an event of its kind naming the run, or a run after it (by fence) before any run
    // that ended the other way.
    let mut runs = stamps_of(&features.dir, "told");
    runs.retain(|run| run.code.is_some());
    runs.sort_by_key(|run| run.fence);
    let carried_until = |event: &str, run: &Stamped| {
        runs.iter()
            .filter(|later| later.fence > run.fence)
            .find(|later| match event {
                "recovered" => later.code != Some(0),
                _ => later.code == Some(0),
            })
            .map_or(i64::MAX, |later| later.fence)
    };
    let told = |hits: &[receiver::Hit], event: &str, run: &Stamped| {
        let until = carried_until(event, run);
        hits.iter().any(|hit| {
            let json = hit.json();
            let names_it = json["trigger"] == run.trigger.as_str()
                && json["tick"]
                    .as_str()
                    .and_then(|tick| chrono::DateTime::parse_from_rfc3339(tick).ok())
                    .is_some_and(|tick| tick == run.tick);
            let carried = json["fence"]
                .as_i64()
                .is_some_and(|fence| fence > run.fence && fence < until);
            json["event"] == event && (names_it || carried)
        })
    };
    let _ = wait_within(Duration::from_secs(90), || {
        let hits = features.receiver.hits_on("/hook");
        proven.iter().all(|(event, run)| told(&hits, event, run))
    });
    let hits = features.receiver.hits_on("/hook");
    for (event, run) in &proven {
        verdict.looked("notification told");
        if !told(&hits, event, run) {
            verdict.note(
                "notification told",
                format!("the {event} of the {} was never told", describe(run)),
            );
        }
    }
    // Ticks claimed in one write share a fence (a catch-up, or ticks queued behind a wait):
    // each run of them is its own transition, so a run is its fence and its tick.
    let mut keys: BTreeMap<(String, String, i64, String), String> = BTreeMap::new();
    for hit in &hits {
        verdict.looked("dedupe key");
        let json = hit.json();
        let (job, event, trigger) = (
            json["job"].as_str().unwrap_or_default().to_string(),
            json["event"].as_str().unwrap_or_default().to_string(),
            json["trigger"].as_str().unwrap_or_default().to_string(),
        );
        let key = json["dedupe_key"].as_str().unwrap_or_default().to_string();
        let fence = json["fence"].as_i64().unwrap_or_default();
        let tick = json["tick"].as_str().unwrap_or_default().to_string();
        if let Some(before) = keys.insert((job.clone(), event.clone(), fence, tick.clone()), key.clone()) {
            if before != key {
                verdict.note(
                    "dedupe key",
                    format!("{job} {event} of fence {fence}, tick {tick}, told with {before}, then with {key}"),
                );
            }
        }
        if trigger == "backfill" {
            let tick = json["tick"]
                .as_str()
                .and_then(|tick| chrono::DateTime::parse_from_rfc3339(tick).ok())
                .map(|tick| tick.with_timezone(&chrono::Utc));
            let scheduled = tick.map(|tick| {
                format!(
                    "{job}/{}/{event}",
                    tick.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                )
            });
            if scheduled.as_deref() == Some(key.as_str()) {
                verdict.note(
                    "dedupe key",
                    format!(
                        "a backfill's {event} of {job} (fence {fence}) carries the key of the scheduled run's: {key}"
                    ),
                );
            }
        }
    }
}

/// SIGHUPs every node's newest process after the configs changed, and waits until each logged
/// its reload; returns when that was, or the deadline.
pub fn reload_every_node(world: &World, ids: &[&str]) -> f64 {
    let reloads = |id: &str| -> usize {
        std::fs::read_to_string(world.dir.path().join(format!("{id}.log")))
            .unwrap_or_default()
            .matches("reloaded jobs.toml")
            .count()
    };
    let before: Vec<usize> = ids.iter().map(|id| reloads(id)).collect();
    for id in ids {
        if let Some(node) = world.nodes.iter().rposition(|node| node.id == *id) {
            world.nodes[node].signal(libc::SIGHUP);
        }
    }
    let _ = wait_within(Duration::from_secs(15), || {
        ids.iter().zip(&before).all(|(id, before)| reloads(id) > *before)
    });
    now_secs()
}

/// Stops every node still running (SIGTERM, their runs going on through the grace), waits
/// until each exited and its leases expired, then lists what is left under the groups' prefix:
/// no slot nor place in line may be.
pub fn stop_and_list_groups(world: &mut World, ttl: u64, verdict: &mut Verdict) {
    for node in &mut world.nodes {
        if matches!(node.child.try_wait(), Ok(None)) {
            node.signal(libc::SIGCONT);
            node.signal(libc::SIGTERM);
        }
    }
    for node in &mut world.nodes {
        // Not `wait_exit`: a node SIGKILLed earlier has no exit code.
        let exited = wait_within(Duration::from_secs(40), || matches!(node.child.try_wait(), Ok(Some(_))));
        if !exited {
            verdict.note(
                "group keys",
                format!("a process of node {} did not exit within 40 s", node.id),
            );
        }
    }
    std::thread::sleep(Duration::from_secs(ttl + 2));
    let (runtime, mut client) = world.etcd_client();
    let keys: Vec<String> = runtime.block_on(async {
        let options = etcd_client::GetOptions::new().with_prefix();
        match client.get("/shardcron/test/groups/", Some(options)).await {
            Ok(read) => read
                .kvs()
                .iter()
                .map(|kv| {
                    format!(
                        "{} = {}",
                        String::from_utf8_lossy(kv.key()),
                        String::from_utf8_lossy(kv.value())
                    )
                })
                .collect(),
            Err(err) => vec![format!("cannot list the groups' keys: {err}")],
        }
    });
    verdict.looked("group keys");
    for key in keys {
        verdict.note("group keys", format!("left in etcd after the fleet stopped: {key}"));
    }
}

/// For the figures: the run's notifications and stamps, counted.
pub fn counts(features: &Features) -> String {
    let runs: usize = super::JOBS
        .iter()
        .map(|(job, ..)| stamps_of(&features.dir, job).len())
        .sum();
    format!(
        "{runs} feature runs stamped, {} notifications taken, {} backfills asked, {} pauses, reloads (sent, logged by every node, limit before, after) {:?}, triggers (by claimed) {:?}",
        features.receiver.hits_on("/hook").len(),
        features.timeline.backfills.len(),
        features.timeline.pauses.len(),
        features.timeline.reloads,
        features.timeline.triggers
    )
}
