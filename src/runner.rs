//! Running one tick of a job: `sh -c <command>` in its own process group.
//!
//! The child's environment is the node's without its secrets ([`ChildEnv`], made once per
//! node), then the job's `env_file` (read at each run) and `env`, then the tick's identity in
//! `CRON_*` variables; it never inherits the node's environment as it is. Its output lines go
//! to the node's log tagged with job and tick; a timeout or a forced shutdown kills the whole
//! process group, so nothing the command started outlives it.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;
use crate::clock;
use crate::config::{Job, MAX_RETRY_BACKOFF};
use crate::env_file;
use crate::gate;
use crate::record::{Outcome, RunRecord, Trigger};
use crate::secrets::ChildEnv;
use crate::spawner::{self, Child};
use crate::starts::{StartTicket, Starts};

/// Longer output lines are cut, so a job printing without newlines cannot grow the node's memory.
pub const MAX_LINE: usize = 8 * 1024;

/// One tick to run.
#[derive(Debug, Clone)]
pub struct Tick {
    pub job: Arc<Job>,
    pub scheduled_at: DateTime<Utc>,
    /// `CRON_FENCE`: the revision of the claim that won the tick.
    pub fence: i64,
    /// `CRON_TERM`: the term of the shard leadership that claimed it (its leader key's create
    /// revision).
    pub term: i64,
    pub node: String,
    /// What the leadership that claimed this tick owes: the tick starts only through it, and
    /// no retry starts once the leadership ended or its lease may have expired.
    pub starts: Arc<Starts>,
    /// A missed tick that a new leader runs late, not a live one.
    pub caught_up: bool,
    /// An earlier leader claimed this tick and never started it.
    pub redelivered: bool,
    /// The request a run asked for by hand answers; `None` for a tick of the schedule.
    pub request: Option<String>,
}

impl Tick {
    /// `CRON_TRIGGER`: a tick of the schedule, or a run asked for by `shardcron trigger`.
    pub fn trigger(&self) -> Trigger {
        match self.request {
            Some(_) => Trigger::Manual,
            None => Trigger::Schedule,
        }
    }

    /// The tick, or a requested run's request time to the millisecond.
    pub fn scheduled_at_text(&self) -> String {
        let precision = match self.trigger() {
            Trigger::Schedule => SecondsFormat::Secs,
            Trigger::Manual => SecondsFormat::Millis,
        };
        self.scheduled_at.to_rfc3339_opts(precision, true)
    }
}

/// Why a running command is stopped from outside.
pub struct Stops<'a> {
    /// The shutdown grace is over: SIGKILL at once.
    pub kill: &'a CancellationToken,
    /// A newer tick replaces this run (`overlap = "replace"`): SIGTERM, SIGKILL after
    /// `kill_grace`.
    pub replace: &'a CancellationToken,
}

/// Runs `tick` to completion, retrying a failed attempt as the job allows while this node still
/// leads the shard, and says how the last attempt ended; `None` when the first attempt could
/// not start because the leadership or its lease ended since `ticket` was given.
pub async fn run(
    tick: &Tick,
    stops: &Stops<'_>,
    mut ticket: Option<StartTicket>,
    child_env: &ChildEnv,
) -> Option<RunRecord> {
    let job = &tick.job;
    let mut attempt = 1;
    let mut backoff = Backoff::new(job.retry_backoff, MAX_RETRY_BACKOFF);
    let mut last = None;
    loop {
        let Some(mut record) = run_once(tick, attempt, stops, ticket.take(), child_env).await else {
            if attempt > 1 {
                tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), attempt, "this node no longer leads the shard, or its lease may have expired: no more retries");
            }
            return last;
        };
        record.attempts = attempt;
        let retryable = match record.outcome {
            Outcome::Exited => record.exit_code != Some(0),
            Outcome::Timeout | Outcome::SpawnFailed => true,
            Outcome::Killed | Outcome::Replaced | Outcome::Skipped | Outcome::Lost | Outcome::Paused => false,
        };
        if !retryable || attempt > job.retries {
            return Some(record);
        }
        let delay = backoff.next_delay();
        tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), fence = tick.fence, attempt, retries = job.retries, retry_in = ?delay, "attempt failed; retrying");
        crate::metrics::get()
            .retries
            .get_or_create(&crate::metrics::JobLabel::new(&job.name))
            .inc();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = tick.starts.leading().cancelled() => {}
            _ = stops.kill.cancelled() => return Some(record),
            _ = stops.replace.cancelled() => return Some(record),
        }
        last = Some(record);
        attempt += 1;
    }
}

/// How many times one attempt is spawned again after the child's lease check refused it while
/// the node's own check still finds the lease held.
const MAX_GATE_REFUSALS: u32 = 3;

/// One attempt; `None` if it may not start: the first attempt's `ticket` or, for a retry, the
/// leadership says no, checked with nothing between the check and the spawn.
async fn run_once(
    tick: &Tick,
    attempt: u32,
    stops: &Stops<'_>,
    ticket: Option<StartTicket>,
    child_env: &ChildEnv,
) -> Option<RunRecord> {
    let job = &tick.job;
    let started = std::time::Instant::now();
    let record = |outcome: Outcome, exit_code: Option<i32>| RunRecord {
        scheduled_at: tick.scheduled_at,
        fence: tick.fence,
        node: tick.node.clone(),
        outcome,
        exit_code,
        duration_ms: started.elapsed().as_millis() as u64,
        finished_at: clock::now(),
        attempts: attempt,
        trigger: tick.trigger(),
    };
    // Read at each run, so a changed secret needs no reload and none stays in the node's
    // memory between runs. Its values go to the child only: no log line or record holds them.
    let secrets = match &job.env_file {
        Some(path) => {
            let path = path.clone();
            let read = tokio::task::spawn_blocking(move || env_file::read(&path).map_err(|err| err.to_string()))
                .await
                .unwrap_or_else(|err| Err(format!("reading the env_file failed: {err}")));
            match read {
                Ok(vars) => vars,
                Err(reason) => {
                    // A leadership that ended meanwhile records nothing: the tick is its next
                    // leader's, as when the spawn itself is refused.
                    if !tick.starts.may_spawn() {
                        return None;
                    }
                    // Recorded like any command that could not start, so retries and alerts on
                    // `spawn_failed` cover it; the reason is in the log.
                    if let Some(ticket) = ticket {
                        ticket.started();
                    }
                    tracing::error!(job = %job.name, tick = %tick.scheduled_at_text(), attempt, error = %reason, "could not start the command: its env_file is refused");
                    return Some(record(Outcome::SpawnFailed, None));
                }
            }
        }
        None => Vec::new(),
    };
    // Built once per spawn: a spawn the child's lease check refused is tried again.
    let build = || {
        let mut command = std::process::Command::new("sh");
        // The node's environment without its secrets, then the job's env_file and env: the
        // child never inherits the node's environment as it is.
        command
            .arg("-c")
            .env_clear()
            .envs(child_env.vars().iter().map(|(name, value)| (name, value)))
            .envs(secrets.iter().map(|(name, value)| (name, value)))
            .envs(&job.env)
            .env("CRON_FENCE", tick.fence.to_string())
            .env("CRON_TERM", tick.term.to_string())
            .env("CRON_JOB", &job.name)
            .env("CRON_SHARD", job.shard.to_string())
            .env("CRON_SCHEDULED_AT", tick.scheduled_at_text())
            .env("CRON_NODE", &tick.node)
            .env("CRON_ATTEMPT", attempt.to_string())
            .env("CRON_TRIGGER", tick.trigger().as_str())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if tick.redelivered {
            command.env("CRON_REDELIVERED", "1");
        } else {
            command.env_remove("CRON_REDELIVERED");
        }
        if let Some(dir) = &job.working_dir {
            command.current_dir(dir);
        }
        command
    };
    let mut refusals = 0;
    let (mut child, stdout) = loop {
        // The first attempt's ticket and a retry's leadership both say yes only while the
        // leadership lasts and its lease holds, read with nothing between the check and the
        // spawn; the child itself checks the lease's deadline once more before the command.
        let (starts, job_for_check) = (Arc::clone(&tick.starts), Arc::clone(job));
        let last_check = move |command: &mut std::process::Command| {
            if !starts.may_spawn_quietly() {
                return false;
            }
            command.arg(gate::script(&job_for_check.command, starts.lease_deadline()));
            true
        };
        let mut child = match spawner::spawn(build(), last_check).await {
            Ok(Some(child)) => child,
            Ok(None) => {
                // A lease the spawner found expired is lost here, on the runtime.
                let _ = tick.starts.may_spawn();
                return None;
            }
            Err(err) => {
                if let Some(ticket) = ticket {
                    ticket.started();
                }
                if crate::descriptors::is_exhaustion(&err) {
                    crate::metrics::get().spawn_descriptor_exhausted.inc();
                    crate::descriptors::note_exhaustion();
                }
                tracing::error!(job = %job.name, tick = %tick.scheduled_at_text(), attempt, error = %err, "could not start the command");
                return Some(record(Outcome::SpawnFailed, None));
            }
        };
        let mut stdout = child.stdout.take().map(BufReader::new);
        if passed_gate(stdout.as_mut()).await {
            break (child, stdout);
        }
        let status = child.wait().await;
        if status.as_ref().is_ok_and(|status| status.code() == Some(gate::REFUSED)) {
            // The deadline the child checked was the one at the spawn: a renewal since may
            // have moved it. While the leadership lasts the tick is still this node's to start;
            // left owed, it would wait for the next leader, maybe for days.
            refusals += 1;
            if refusals <= MAX_GATE_REFUSALS && tick.starts.may_spawn() {
                tracing::info!(job = %job.name, tick = %tick.scheduled_at_text(), attempt, refusals, "the child's lease check refused, and the lease has been renewed since: spawning it again");
                continue;
            }
            tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), attempt, "the lease may have expired before the command could run: not run");
            return None;
        }
        // The shell could not even read the line the gate shares with the command.
        if let Some(ticket) = ticket {
            ticket.started();
        }
        tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), attempt, status = ?status, "the shell ended before running the command; check its first line");
        return Some(record(Outcome::Exited, status.ok().and_then(|status| status.code())));
    };
    let pid = child.pid();
    if let Some(ticket) = ticket {
        ticket.started();
    }
    tracing::info!(job = %job.name, tick = %tick.scheduled_at_text(), fence = tick.fence, attempt, pid = pid.as_raw_pid(), "run started");
    let stdout = stdout.map(|out| tokio::spawn(forward_lines(out, tick.clone(), "stdout")));
    let stderr = child
        .stderr
        .take()
        .map(|err| tokio::spawn(forward_lines(err, tick.clone(), "stderr")));

    let timeout = async {
        match job.timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let terminate = |why: &str| {
        tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), attempt, kill_grace = ?job.kill_grace, "{why}: SIGTERM to the process group");
        signal_group(pid, Signal::TERM);
    };
    let mut outcome = Outcome::Exited;
    let status = tokio::select! {
        status = child.wait() => status,
        _ = timeout => {
            outcome = Outcome::Timeout;
            terminate("timed out");
            wait_or_kill(&mut child, pid, job.kill_grace, stops.kill, tick).await
        }
        _ = stops.replace.cancelled() => {
            outcome = Outcome::Replaced;
            terminate("replaced by a newer tick (overlap = \"replace\")");
            wait_or_kill(&mut child, pid, job.kill_grace, stops.kill, tick).await
        }
        _ = stops.kill.cancelled() => {
            tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), "shutdown grace is over: SIGKILL to the process group");
            outcome = Outcome::Killed;
            signal_group(pid, Signal::KILL);
            child.wait().await
        }
    };
    if outcome == Outcome::Exited && group_alive(pid) {
        // A run ends with its command: what the shell left running in the background would
        // outlive the run, its record and its fence, and hold the output pipes open.
        tracing::info!(job = %job.name, tick = %tick.scheduled_at_text(), attempt, "the command exited and left processes in its group: SIGTERM to the group");
        signal_group(pid, Signal::TERM);
        end_group(pid, job.kill_grace, stops.kill, tick).await;
    }
    // Whatever still holds the pipes open, the readers stop rather than outlive the run.
    for mut reader in [stdout, stderr].into_iter().flatten() {
        if tokio::time::timeout(Duration::from_secs(1), &mut reader).await.is_err() {
            reader.abort();
            tracing::debug!(job = %job.name, "output reader still open after exit; stopped");
        }
    }
    let exit_code = status.as_ref().ok().and_then(|status| status.code());
    let record = record(outcome, exit_code);
    match &status {
        Ok(status) if status.success() && outcome == Outcome::Exited => {
            tracing::info!(job = %job.name, tick = %tick.scheduled_at_text(), fence = tick.fence, attempt, duration_ms = record.duration_ms, "run succeeded")
        }
        Ok(status) => {
            tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), fence = tick.fence, attempt, duration_ms = record.duration_ms, status = %status, outcome = outcome.as_str(), "run failed")
        }
        Err(err) => {
            tracing::error!(job = %job.name, tick = %tick.scheduled_at_text(), attempt, error = %err, "could not wait for the command")
        }
    }
    Some(record)
}

/// After a SIGTERM: waits `grace` for the command to exit, then SIGKILLs its process group.
///
/// The shell exiting is not enough: a process it started may ignore SIGTERM and keep the group
/// alive, so the group itself is watched until it is gone or the grace is over.
async fn wait_or_kill(
    child: &mut Child,
    pid: Pid,
    grace: Duration,
    kill: &CancellationToken,
    tick: &Tick,
) -> std::io::Result<std::process::ExitStatus> {
    let deadline = tokio::time::Instant::now() + grace;
    let status = tokio::select! {
        status = child.wait() => status,
        _ = tokio::time::sleep_until(deadline) => {
            tracing::warn!(job = %tick.job.name, tick = %tick.scheduled_at_text(), "still running after SIGTERM: SIGKILL to the process group");
            signal_group(pid, Signal::KILL);
            return child.wait().await;
        }
        _ = kill.cancelled() => {
            signal_group(pid, Signal::KILL);
            return child.wait().await;
        }
    };
    end_group(
        pid,
        deadline.saturating_duration_since(tokio::time::Instant::now()),
        kill,
        tick,
    )
    .await;
    status
}

/// Once a SIGTERM went to the group of a command that exited: waits `grace` for the processes
/// it started to end, then SIGKILLs the group.
async fn end_group(pid: Pid, grace: Duration, kill: &CancellationToken, tick: &Tick) {
    let deadline = tokio::time::Instant::now() + grace;
    while group_alive(pid) {
        tokio::select! {
            _ = tokio::time::sleep(GROUP_POLL) => {}
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!(job = %tick.job.name, tick = %tick.scheduled_at_text(), "the command exited but a process it started ignores SIGTERM: SIGKILL to the process group");
                signal_group(pid, Signal::KILL);
                break;
            }
            _ = kill.cancelled() => {
                signal_group(pid, Signal::KILL);
                break;
            }
        }
    }
}

/// How often a process group that outlived its shell is checked during the kill grace.
const GROUP_POLL: Duration = Duration::from_millis(50);

/// Whether any process of the group `pid` leads (a run's command starts in a group of its own)
/// still exists.
fn group_alive(pid: Pid) -> bool {
    rustix::process::test_kill_process_group(pid).is_ok()
}

/// Signals every process of the group `pid` leads. A group that is gone already is not an error:
/// its processes ended on their own.
fn signal_group(pid: Pid, signal: Signal) {
    let _ = rustix::process::kill_process_group(pid, signal);
}

/// Reads the child's first line: whether it is the gate's, which says the command runs now.
async fn passed_gate<R: AsyncRead + Unpin>(stdout: Option<&mut BufReader<R>>) -> bool {
    let Some(stdout) = stdout else { return false };
    let mut line = Vec::with_capacity(gate::PASSED.len() + 1);
    read_bounded_line(stdout, &mut line).await.is_ok() && line.strip_suffix(b"\n") == Some(gate::PASSED.as_bytes())
}

async fn forward_lines(stream: impl AsyncRead + Unpin, tick: Tick, name: &'static str) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        match read_bounded_line(&mut reader, &mut line).await {
            Ok(0) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                tracing::info!(job = %tick.job.name, tick = %tick.scheduled_at_text(), fence = tick.fence, stream = name, "{text}");
            }
            Err(err) => {
                tracing::debug!(job = %tick.job.name, error = %err, "output stream closed");
                return;
            }
        }
    }
}

/// Reads one line into `line`, keeping at most [`MAX_LINE`] bytes of it and discarding the rest.
/// Returns the number of bytes consumed, 0 at end of stream.
async fn read_bounded_line<R: AsyncBufReadExt + Unpin>(reader: &mut R, line: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut consumed = 0;
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(consumed);
        }
        let (take, done) = match buffer.iter().position(|&b| b == b'\n') {
            Some(newline) => (newline + 1, true),
            None => (buffer.len(), false),
        };
        let room = MAX_LINE.saturating_sub(line.len());
        line.extend_from_slice(&buffer[..take.min(room)]);
        reader.consume(take);
        consumed += take;
        if done {
            return Ok(consumed);
        }
    }
}
