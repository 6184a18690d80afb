//! Running one tick of a job: `sh -c <command>` in its own process group.
//!
//! The child gets the tick's identity in `CRON_*` variables; its output lines go to the node's
//! log tagged with job and tick; a timeout or a forced shutdown kills the whole process group,
//! so nothing the command started outlives it.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::clock;
use crate::config::Job;
use crate::ledger::RunRecord;

/// After SIGTERM to a timed-out job, how long before SIGKILL.
pub const KILL_GRACE: Duration = Duration::from_secs(10);
/// Longer output lines are cut, so a job printing without newlines cannot grow the node's memory.
pub const MAX_LINE: usize = 8 * 1024;

/// One tick to run.
#[derive(Debug, Clone)]
pub struct Tick {
    pub job: Arc<Job>,
    pub scheduled_at: DateTime<Utc>,
    pub fence: i64,
    pub node: String,
}

impl Tick {
    pub fn scheduled_at_text(&self) -> String {
        self.scheduled_at.to_rfc3339_opts(SecondsFormat::Secs, true)
    }
}

/// Runs `tick` to completion and says how it ended. `kill` cancels the run at once (forced
/// shutdown); the run's own timeout is handled here.
pub async fn run(tick: &Tick, kill: &CancellationToken) -> RunRecord {
    let job = &tick.job;
    let started = std::time::Instant::now();
    let record = |outcome: &str, exit_code: Option<i32>| RunRecord {
        scheduled_at: tick.scheduled_at,
        fence: tick.fence,
        node: tick.node.clone(),
        outcome: outcome.to_string(),
        exit_code,
        duration_ms: started.elapsed().as_millis() as u64,
        finished_at: clock::now(),
    };
    let mut command = Command::new("sh");
    command
        .arg("-c")
        .arg(&job.command)
        .envs(&job.env)
        .env("CRON_FENCE", tick.fence.to_string())
        .env("CRON_JOB", &job.name)
        .env("CRON_SHARD", job.shard.to_string())
        .env("CRON_SCHEDULED_AT", tick.scheduled_at_text())
        .env("CRON_NODE", &tick.node)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = &job.working_dir {
        command.current_dir(dir);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => {
            tracing::error!(job = %job.name, tick = %tick.scheduled_at_text(), error = %err, "could not start the command");
            return record("spawn_failed", None);
        }
    };
    let pid = child.id();
    tracing::info!(job = %job.name, tick = %tick.scheduled_at_text(), fence = tick.fence, pid, "run started");
    let stdout = child
        .stdout
        .take()
        .map(|out| tokio::spawn(forward_lines(out, tick.clone(), "stdout")));
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
    let mut outcome = "exited";
    let status = tokio::select! {
        status = child.wait() => status,
        _ = timeout => {
            tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), timeout = ?job.timeout, "timed out: SIGTERM to the process group");
            outcome = "timeout";
            signal_group(pid, libc::SIGTERM);
            tokio::select! {
                status = child.wait() => status,
                _ = tokio::time::sleep(KILL_GRACE) => {
                    tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), "still running after SIGTERM: SIGKILL to the process group");
                    signal_group(pid, libc::SIGKILL);
                    child.wait().await
                }
            }
        }
        _ = kill.cancelled() => {
            tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), "shutdown grace is over: SIGKILL to the process group");
            outcome = "killed";
            signal_group(pid, libc::SIGKILL);
            child.wait().await
        }
    };
    // The group may still hold the pipes open; stop reading rather than wait for it.
    for reader in [stdout, stderr].into_iter().flatten() {
        if tokio::time::timeout(Duration::from_secs(1), reader).await.is_err() {
            tracing::debug!(job = %job.name, "output reader still open after exit; detached");
        }
    }
    let exit_code = status.as_ref().ok().and_then(|status| status.code());
    let record = record(outcome, exit_code);
    match &status {
        Ok(status) if status.success() => {
            tracing::info!(job = %job.name, tick = %tick.scheduled_at_text(), fence = tick.fence, duration_ms = record.duration_ms, "run succeeded")
        }
        Ok(status) => {
            tracing::warn!(job = %job.name, tick = %tick.scheduled_at_text(), fence = tick.fence, duration_ms = record.duration_ms, status = %status, outcome, "run failed")
        }
        Err(err) => {
            tracing::error!(job = %job.name, tick = %tick.scheduled_at_text(), error = %err, "could not wait for the command")
        }
    }
    record
}

fn signal_group(pid: Option<u32>, signal: libc::c_int) {
    if let Some(pid) = pid {
        // SAFETY: kill(2) with a negative pid signals the process group the child leads; it
        // touches no memory of ours.
        unsafe {
            libc::kill(-(pid as libc::pid_t), signal);
        }
    }
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
                tracing::info!(job = %tick.job.name, tick = %tick.scheduled_at_text(), stream = name, "{text}");
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
