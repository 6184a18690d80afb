//! The features the randomized fault run carries beside its per-second jobs, and what it checks
//! of them. Jobs: `skip0` (`overlap = "skip"`) and `repl0` (`"replace"`), each running longer
//! than its period; groups `one` (`limit = 1`) and `three` (`limit = 3`, lowered to 1 and back by
//! SIGHUP reloads), `three`'s jobs partly inside a blackout window; `told`, failing three ticks in
//! six, with a notifier whose receiver listens on the host's end of the first namespace's veth
//! pair (each namespace has a route to it); `pooled` (`run_on = ["pool"]`, nodes a and b), paused
//! and resumed now and then; `fanned` (`fan_out = "all"`). Backfills of `skip0` and `told` go,
//! manual triggers come now and then. Every job stamps its start, the end of its process (a
//! watcher outside its process group, so a run killed by its node is stamped too) and, when it
//! ends by itself, its exit code; the checkers read those stamps.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};

use crate::support::receiver::Receiver;
use crate::support::*;

pub mod check;

/// How far apart two stamps must be to be told apart: a start is stamped by `date` after the
/// process started and an end by a watcher (`perl`, polling every 20 ms) after it ended, on a
/// busy 2-core machine. Two runs closer than this are not counted as overlapping.
pub const RESOLUTION: f64 = 0.25;

/// The feature jobs: name, schedule, seconds of a scheduled run, seconds of any other run,
/// exit rule, and the rest of its table.
const JOBS: [(&str, &str, &str, &str, &str, &str); 11] = [
    ("skip0", "*/4 * * * * *", "5", "1", "ok", "overlap = \"skip\""),
    ("repl0", "*/3 * * * * *", "5", "2", "ok", "overlap = \"replace\""),
    ("grp1a", "*/3 * * * * *", "2", "2", "ok", "group = \"one\""),
    ("grp1b", "1-59/3 * * * * *", "2", "2", "ok", "group = \"one\""),
    (
        "grp3a",
        "*/3 * * * * *",
        "2.5",
        "2.5",
        "ok",
        "group = \"three\"\nblackouts = [\"quiet\"]",
    ),
    (
        "grp3b",
        "*/3 * * * * *",
        "2.5",
        "2.5",
        "ok",
        "group = \"three\"\nblackouts = [\"quiet\"]",
    ),
    ("grp3c", "*/3 * * * * *", "2.5", "2.5", "ok", "group = \"three\""),
    ("grp3d", "1-59/3 * * * * *", "2.5", "2.5", "ok", "group = \"three\""),
    ("told", "* * * * * *", "0.1", "0.1", "flap", "notify = [\"ops\"]"),
    (
        "pooled",
        "*/2 * * * * *",
        "0.2",
        "0.2",
        "ok",
        "run_on = [\"pool\"]\ngroup = \"three\"",
    ),
    ("fanned", "*/2 * * * * *", "0.2", "0.2", "ok", "fan_out = \"all\""),
];

/// The groups and the jobs in each.
pub const GROUPS: [(&str, &[&str]); 2] = [
    ("one", &["grp1a", "grp1b"]),
    ("three", &["grp3a", "grp3b", "grp3c", "grp3d", "pooled"]),
];

/// Jobs inside the `quiet` blackout: it opens every 20 s for 5 s.
pub const QUIET: [&str; 2] = ["grp3a", "grp3b"];

/// A job's stamps, through `$1`, and its own exit code where it ended by itself.
const SCRIPT: &str = r#"#!/bin/sh
# job.sh STAMPS SCHEDULED_SECS OTHER_SECS ok|flap
f=$1
who="$CRON_TRIGGER $CRON_SCHEDULED_AT $CRON_FENCE $CRON_NODE ${CRON_REDELIVERED:-0}"
echo "start $who $(date +%s.%N)" >> "$f"
# Out of the run's process group and session, so a kill of the run does not reach it: stamps
# the end once this shell is gone or a zombie (a killed run's shell may wait a while for pid 1
# to reap it).
setsid perl -MTime::HiRes=sleep,time -e '
  my ($pid, $who, $file) = @ARGV;
  while (open(my $stat, "<", "/proc/$pid/stat")) {
    my $line = <$stat>;
    last if !defined $line || $line =~ /\) [ZX] /;
    sleep 0.02;
  }
  open(my $out, ">>", $file) or exit 1;
  printf $out "end %s %.6f\n", $who, time;
' "$$" "$who" "$f" </dev/null >/dev/null 2>&1 &
case $CRON_TRIGGER in schedule) sleep "$2";; *) sleep "$3";; esac
code=0
if [ "$4" = flap ]; then
  s=$(date -d "$CRON_SCHEDULED_AT" +%s)
  [ $((s % 6)) -lt 3 ] && code=1
fi
echo "done $who $code" >> "$f"
exit $code
"#;

/// One run as its job stamped it.
#[derive(Debug, Clone)]
pub struct Stamped {
    pub job: String,
    pub trigger: String,
    pub tick: DateTime<Utc>,
    pub fence: i64,
    pub node: String,
    pub redelivered: bool,
    pub started: f64,
    pub ended: Option<f64>,
    /// Its exit code, when the command ended by itself.
    pub code: Option<i32>,
}

impl Stamped {
    pub fn end(&self) -> f64 {
        self.ended.unwrap_or(f64::INFINITY)
    }
}

pub fn stamps_of(dir: &Path, job: &str) -> Vec<Stamped> {
    let text = std::fs::read_to_string(dir.join(format!("stamps-{job}.log"))).unwrap_or_default();
    let mut runs: Vec<Stamped> = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [what, trigger, tick, fence, node, redelivered, last] = fields[..] else {
            continue;
        };
        let (Ok(tick), Ok(fence)) = (DateTime::parse_from_rfc3339(tick), fence.parse::<i64>()) else {
            continue;
        };
        let tick = tick.with_timezone(&Utc);
        let same = |run: &Stamped| run.fence == fence && run.node == node && run.tick == tick && run.trigger == trigger;
        match what {
            "start" => runs.push(Stamped {
                job: job.to_string(),
                trigger: trigger.to_string(),
                tick,
                fence,
                node: node.to_string(),
                redelivered: redelivered == "1",
                started: last.parse().unwrap_or(f64::NAN),
                ended: None,
                code: None,
            }),
            "end" => {
                if let Some(run) = runs.iter_mut().rev().find(|run| same(run)) {
                    run.ended = last.parse().ok();
                }
            }
            _ => {
                if let Some(run) = runs.iter_mut().rev().find(|run| same(run)) {
                    run.code = last.parse().ok();
                }
            }
        }
    }
    runs
}

/// What happened to the fleet and when, for the checkers' exemptions and limits.
#[derive(Default, Debug)]
pub struct Timeline {
    /// (node, SIGKILL at).
    pub kills: Vec<(String, f64)>,
    /// (node, SIGSTOP at, SIGCONT at).
    pub stops: Vec<(String, f64, f64)>,
    /// (SIGHUP sent, every node reloaded, limit of `three` before, after).
    pub reloads: Vec<(f64, f64, u32, u32)>,
    /// (paused at, resumed at) of `pooled`.
    pub pauses: Vec<(f64, f64)>,
    /// (job, its ticks) of each backfill asked.
    pub backfills: Vec<(String, Vec<DateTime<Utc>>)>,
    /// (restarted at, node, on how many shards): every node starts on 3.
    pub shard_counts: Vec<(f64, String, u32)>,
    /// Manual triggers asked, by whether `trigger` answered.
    pub triggers: BTreeMap<bool, usize>,
}

/// The run's setup: where stamps go, the receiver, the limit of `three` in the configs now.
pub struct Features {
    pub dir: PathBuf,
    pub receiver: Receiver,
    pub limit: u32,
    pub timeline: Timeline,
    backfills_asked: u32,
    /// When the run began, seconds since the epoch: the backfills' ranges count back from it.
    began: i64,
    paused_since: Option<f64>,
}

impl Features {
    /// Writes the job script; the receiver listens on `host`, which every node's namespace
    /// routes to.
    pub fn new(world: &World, host: std::net::Ipv4Addr) -> Features {
        let dir = world.dir.path().to_path_buf();
        let script = dir.join("job.sh");
        std::fs::write(&script, SCRIPT).expect("write job.sh");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod job.sh");
        Features {
            dir,
            receiver: Receiver::start_on(host),
            limit: 3,
            timeline: Timeline::default(),
            backfills_asked: 0,
            began: Utc::now().timestamp(),
            paused_since: None,
        }
    }

    /// Adds the features to a config [`World::write_config`] wrote: the same [`cluster`] for
    /// every variant, pools of 2 shards, `three`'s limit as `self.limit`.
    pub fn add_to(&self, config: &Path) {
        let text = std::fs::read_to_string(config).expect("read config");
        let mut text = text.replacen("\n\n[etcd]", "\npool_shards = 2\n\n[etcd]", 1);
        let script = self.dir.join("job.sh");
        for (name, schedule, scheduled, other, exit, extra) in JOBS {
            let stamps = self.dir.join(format!("stamps-{name}.log"));
            text.push_str(&format!(
                "[jobs.{name}]\nschedule = \"{schedule}\"\ncommand = '{} {} {scheduled} {other} {exit}'\n{extra}\n\n",
                script.display(),
                stamps.display()
            ));
        }
        text.push_str(&format!(
            "[groups.one]\nlimit = 1\n\n[groups.three]\nlimit = {}\n\n[blackouts.quiet]\nwindows = [{{ start = \"*/20 * * * * *\", duration = \"5s\" }}]\n\n[notify.ops]\nurl = \"{}\"\n",
            self.limit,
            self.receiver.url("/hook")
        ));
        std::fs::write(config, text).expect("write config");
        let out = shardcron(config, &["check"]);
        assert!(
            out.status.success(),
            "shardcron check refuses the run's config: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The arguments every node runs with: a shutdown grace long enough that a run goes on
    /// through it, and the pool's tag on a and b.
    pub fn node_args(id: &str) -> Vec<&'static str> {
        let mut args = vec!["--shutdown-grace", "20s"];
        if id != "c" {
            args.extend(["--tags", "pool"]);
        }
        args
    }

    /// A going run of a skip, replace or grouped job, or a backfill run, whose node a SIGTERM
    /// with a grace should hit: the newest one started, waiting up to 4 s for one.
    pub fn a_going_run(&self) -> Option<Stamped> {
        let mut found = None;
        let _ = wait_within(Duration::from_secs(4), || {
            let now = now_secs();
            found = ["skip0", "repl0", "grp1a", "grp3c"]
                .iter()
                .flat_map(|job| stamps_of(&self.dir, job))
                .filter(|run| run.ended.is_none() && now - run.started < 3.0 && now - run.started > 0.3)
                .max_by(|a, b| a.started.total_cmp(&b.started));
            found.is_some()
        });
        found
    }

    /// Asks a backfill of `skip0` and one of `told` over ranges of the past no backfill asked
    /// before, once those asked earlier are done; returns what it did, if anything.
    pub fn backfill_now_and_then(&mut self, config: &Path) -> Option<String> {
        let done = self.timeline.backfills.iter().all(|(job, ticks)| {
            let runs = stamps_of(&self.dir, job);
            ticks
                .iter()
                .all(|tick| runs.iter().any(|run| run.trigger == "backfill" && run.tick == *tick))
        });
        if !done {
            return None;
        }
        self.backfills_asked += 1;
        // Each backfill a range of its own: a minute that starts 100 s before the last one's,
        // counted back from an hour before the run began.
        let back = i64::from(self.backfills_asked) * 100;
        let mut asked = Vec::new();
        for (job, step, count) in [("skip0", 4, 4), ("told", 1, 12)] {
            let from_secs = (self.began - 3600 - back) / 60 * 60;
            let from = DateTime::<Utc>::from_timestamp(from_secs, 0).expect("a second");
            let ticks: Vec<DateTime<Utc>> = (0..count)
                .map(|at| from + chrono::Duration::seconds(step * at))
                .collect();
            let to = from + chrono::Duration::seconds(step * count);
            let rfc3339 = |at: DateTime<Utc>| at.to_rfc3339_opts(SecondsFormat::Secs, true);
            let out = shardcron(
                config,
                &[
                    "backfill",
                    job,
                    "--from",
                    &rfc3339(from),
                    "--to",
                    &rfc3339(to),
                    "--detach",
                ],
            );
            if out.status.success() {
                self.timeline.backfills.push((job.to_string(), ticks));
                asked.push(format!("{job} {count} ticks from {from}"));
            } else {
                asked.push(format!(
                    "{job} refused: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Some(format!("backfill {}", asked.join("; ")))
    }

    /// A manual run of one of the jobs whose rules a manual run must keep.
    pub fn trigger(&mut self, config: &Path, pick: u64) -> String {
        let job = ["skip0", "repl0", "grp1a", "grp3c", "told"][pick as usize % 5];
        let out = shardcron(config, &["trigger", job, "--timeout", "5s"]);
        *self.timeline.triggers.entry(out.status.success()).or_default() += 1;
        format!(
            "trigger {job}: {}",
            if out.status.success() { "claimed" } else { "not claimed" }
        )
    }

    /// Pauses `pooled`, or resumes it if paused.
    pub fn pause_or_resume(&mut self, config: &Path) -> String {
        match self.paused_since.take() {
            None => {
                let out = shardcron(config, &["pause", "pooled", "--reason", "chaos"]);
                assert!(out.status.success(), "pause: {}", String::from_utf8_lossy(&out.stderr));
                self.paused_since = Some(now_secs());
                "pause pooled".into()
            }
            Some(since) => {
                let at = now_secs();
                let out = shardcron(config, &["resume", "pooled"]);
                assert!(out.status.success(), "resume: {}", String::from_utf8_lossy(&out.stderr));
                self.timeline.pauses.push((since, at));
                "resume pooled".into()
            }
        }
    }

    /// Ends a pause still in force, for the run's end.
    pub fn resume_if_paused(&mut self, config: &Path) {
        if self.paused_since.is_some() {
            self.pause_or_resume(config);
        }
    }
}

impl Timeline {
    /// How many shards `node` ran on at `at`.
    pub fn shards_of(&self, node: &str, at: f64) -> u32 {
        self.shard_counts
            .iter()
            .filter(|(since, each, _)| each == node && *since <= at)
            .map(|(_, _, shards)| *shards)
            .next_back()
            .unwrap_or(3)
    }
}
