//! One attempt of a tick: read its env_file, spawn it behind the lease gate, wait for it, and
//! say how it ended. Runs inside the run's and the attempt's spans, so its log lines name no
//! job, tick, fence or attempt themselves.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use tokio::io::BufReader;
use tokio::process::ChildStdout;

use super::child::Child;
use super::output::{self, Forwarding};
use super::{Stops, Tick};
use crate::clock;
use crate::coord::starts::StartTicket;
use crate::rules::config::Job;
use crate::rules::record::{Outcome, RunRecord};
use crate::running::env_file;
use crate::running::gate;
use crate::secrets::ChildEnv;

/// How many times one attempt is spawned again after the child's lease check refused it while
/// the node's own check still finds the lease held.
const MAX_GATE_REFUSALS: u32 = 3;

/// How long past the lease deadline written into its gate the node waits for a child's first
/// line. After the deadline the child's check can no longer pass, and a child that is merely
/// slow to start refuses by itself; one silent this long is stopped or starved, and is killed
/// before it can run the command that late.
const GATE_SLACK: Duration = Duration::from_secs(5);

/// One attempt of `tick`; `None` if it may not start: the first attempt's `ticket` or, for a
/// retry, the leadership says no, checked with nothing between the check and the spawn.
pub(super) async fn run_once(
    tick: &Tick,
    attempt: u32,
    stops: &Stops<'_>,
    mut ticket: Option<StartTicket>,
    child_env: &ChildEnv,
) -> Option<RunRecord> {
    let this = Attempt {
        tick,
        number: attempt,
        started: Instant::now(),
    };
    let secrets = match read_env_file(&tick.job).await {
        Ok(secrets) => secrets,
        Err(reason) => {
            // A leadership that ended meanwhile records nothing: the tick is its next leader's,
            // as when the spawn itself is refused.
            if !tick.starts.may_spawn() {
                return None;
            }
            // Recorded like any command that could not start, so retries and alerts on
            // `spawn_failed` cover it; the reason is in the log.
            started(&mut ticket);
            tracing::error!(error = %reason, "could not start the command: its env_file is refused");
            return Some(this.record(Outcome::SpawnFailed, None));
        }
    };
    let (mut child, stdout) = match this.start(&secrets, child_env).await {
        Start::Running(running) => *running,
        Start::NotRun => return None,
        Start::Ended(outcome, exit_code) => {
            started(&mut ticket);
            return Some(this.record(outcome, exit_code));
        }
    };
    started(&mut ticket);
    tracing::info!(pid = child.pid().as_raw_pid(), "run started");
    let forwarding = Forwarding::start(stdout, child.take_stderr(), &tick.job);
    let (outcome, status) = supervise(&mut child, &tick.job, stops).await;
    let output = forwarding.finish().await;
    let record = RunRecord {
        output,
        ..this.record(outcome, status.as_ref().ok().and_then(ExitStatus::code))
    };
    log_end(&record, &status);
    Some(record)
}

fn started(ticket: &mut Option<StartTicket>) {
    if let Some(ticket) = ticket.take() {
        ticket.started();
    }
}

/// Read at each run, so a changed secret needs no reload and none stays in the node's memory
/// between runs. Its values go to the child only: no log line or record holds them.
async fn read_env_file(job: &Job) -> Result<Vec<(String, String)>, String> {
    let Some(path) = job.env_file.clone() else {
        return Ok(Vec::new());
    };
    tokio::task::spawn_blocking(move || env_file::read(&path).map_err(|err| err.to_string()))
        .await
        .unwrap_or_else(|err| Err(format!("reading the env_file failed: {err}")))
}

/// How a spawn behind the gate came out.
enum Start {
    /// The child passed the gate: the command runs.
    /// Boxed: a child with its reader is large beside the other answers.
    Running(Box<(Child, Option<BufReader<ChildStdout>>)>),
    /// The command may not run: the leadership or its lease ended.
    NotRun,
    /// The attempt ended without the command running as it should: the spawn failed, the shell
    /// could not read the gate's line, or the child passed the gate too late and was killed.
    Ended(Outcome, Option<i32>),
}

struct Attempt<'a> {
    tick: &'a Tick,
    number: u32,
    started: Instant,
}

impl Attempt<'_> {
    fn record(&self, outcome: Outcome, exit_code: Option<i32>) -> RunRecord {
        RunRecord {
            scheduled_at: self.tick.scheduled_at,
            fence: self.tick.fence,
            node: self.tick.node.clone(),
            outcome,
            exit_code,
            duration_ms: self.started.elapsed().as_millis() as u64,
            finished_at: clock::now(),
            attempts: self.number,
            trigger: self.tick.trigger(),
            output: None,
            blackout: None,
        }
    }

    /// The command, without its script: the gate's deadline is added right before the spawn.
    /// Built once per spawn, since a spawn the child's lease check refused is tried again.
    fn command(&self, secrets: &[(String, String)], child_env: &ChildEnv) -> std::process::Command {
        let (tick, job) = (self.tick, &self.tick.job);
        // One list for the whole spawn: a reload may scrub more names while it is built.
        let node_vars = child_env.vars();
        let mut command = std::process::Command::new(shell(child_path(secrets, &node_vars, job)));
        // The node's environment without its secrets, then the job's env_file and env: the
        // child never inherits the node's environment as it is.
        command
            .arg("-c")
            .env_clear()
            .envs(node_vars.iter().map(|(name, value)| (name, value)))
            .envs(secrets.iter().map(|(name, value)| (name, value)))
            .envs(&job.env)
            .env("CRON_FENCE", tick.fence.to_string())
            .env("CRON_TERM", tick.term.to_string())
            .env("CRON_JOB", job.job_name())
            .env("CRON_SHARD", job.pool_shard.to_string())
            .env("CRON_POOL", job.run_on.id())
            .env("CRON_SCHEDULED_AT", tick.scheduled_at_text())
            .env("CRON_NODE", &tick.node)
            .env("CRON_ATTEMPT", self.number.to_string())
            .env("CRON_TRIGGER", tick.trigger().as_str())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if tick.arrival.redelivered() {
            command.env("CRON_REDELIVERED", "1");
        } else {
            command.env_remove("CRON_REDELIVERED");
        }
        if let Some(dir) = &job.working_dir {
            command.current_dir(dir);
        }
        command
    }

    /// Spawns the command behind the lease gate, again while the child's check refuses and the
    /// node's own check still finds the lease held.
    async fn start(&self, secrets: &[(String, String)], child_env: &ChildEnv) -> Start {
        let starts = &self.tick.starts;
        let mut refusals = 0;
        loop {
            // The first attempt's ticket and a retry's leadership both say yes only while the
            // leadership lasts and its lease holds, read with nothing between the check and the
            // spawn; the child itself checks the lease's deadline once more before the command.
            if !starts.may_spawn() {
                return Start::NotRun;
            }
            let deadline = starts.lease_deadline();
            let mut command = self.command(secrets, child_env);
            command.arg(gate::script(&self.tick.job.command, deadline));
            let mut child = match Child::spawn(command) {
                Ok(child) => child,
                Err(err) => {
                    if crate::running::descriptors::is_exhaustion(&err) {
                        crate::metrics::get().spawn_descriptor_exhausted.inc();
                        crate::running::descriptors::note_exhaustion();
                    }
                    tracing::error!(error = %err, "could not start the command");
                    return Start::Ended(Outcome::SpawnFailed, None);
                }
            };
            let mut stdout = child.take_stdout().map(BufReader::new);
            let Some(reader) = stdout.as_mut() else {
                return Start::Ended(Outcome::SpawnFailed, None);
            };
            let mut line = Vec::new();
            let answered =
                tokio::time::timeout_at((deadline + GATE_SLACK).into(), output::first_line(reader, &mut line))
                    .await
                    .is_ok();
            if !answered {
                if let Some(ended) = Self::too_late(child, reader, line).await {
                    return ended;
                }
            } else if output::is_gate_line(&line) {
                return Start::Running(Box::new((child, stdout)));
            } else {
                let status = child.wait().await;
                if !status.as_ref().is_ok_and(|status| status.code() == Some(gate::REFUSED)) {
                    // The shell could not even read the line the gate shares with the command.
                    tracing::warn!(status = ?status, "the shell ended before running the command; check its first line");
                    return Start::Ended(Outcome::Exited, status.ok().and_then(|status| status.code()));
                }
            }
            // The deadline the child checked was the one at the spawn: a renewal since may have
            // moved it. While the leadership lasts the tick is still this node's to start; left
            // owed, it would wait for the next leader, maybe for days.
            refusals += 1;
            if refusals <= MAX_GATE_REFUSALS && starts.may_spawn() {
                tracing::info!(
                    refusals,
                    "the child's lease check refused, and the lease has been renewed since: spawning it again"
                );
                continue;
            }
            tracing::warn!("the lease may have expired before the command could run: not run");
            return Start::NotRun;
        }
    }

    /// The child said nothing until past the deadline its gate checks: it is killed before it
    /// can run the command that late. If its gate's line reached the pipe before the kill, the
    /// command did start, and the attempt ends `killed`; `None` if it never ran, which is a
    /// refusal like the child's own.
    async fn too_late(mut child: Child, stdout: &mut BufReader<ChildStdout>, mut line: Vec<u8>) -> Option<Start> {
        child.signal_group(Signal::KILL);
        let _ = child.wait().await;
        // The whole group is gone, so the pipe is at its end once what they wrote is read.
        let _ = tokio::time::timeout(Duration::from_secs(1), output::first_line(stdout, &mut line)).await;
        if output::is_gate_line(&line) {
            tracing::warn!(waited_past_deadline = ?GATE_SLACK, "the child passed its lease check but answered too late: SIGKILL to the process group");
            return Some(Start::Ended(Outcome::Killed, None));
        }
        tracing::warn!(waited_past_deadline = ?GATE_SLACK, "the child did not reach its lease check before the lease's deadline: SIGKILL to the process group");
        None
    }
}

/// Waits for the running command to exit, stopping its group on a timeout, a replacing tick or
/// the end of the shutdown grace; says how it ended.
async fn supervise(child: &mut Child, job: &Job, stops: &Stops<'_>) -> (Outcome, std::io::Result<ExitStatus>) {
    let timeout = async {
        match job.timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let terminate = |child: &Child, why: &str| {
        tracing::warn!(kill_grace = ?job.kill_grace, "{why}: SIGTERM to the process group");
        child.signal_group(Signal::TERM);
    };
    let (outcome, status) = tokio::select! {
        status = child.wait() => (Outcome::Exited, status),
        _ = timeout => {
            terminate(child, "timed out");
            (Outcome::Timeout, child.wait_or_kill(job.kill_grace, stops.kill).await)
        }
        _ = stops.replace.cancelled() => {
            terminate(child, "replaced by a newer tick (overlap = \"replace\")");
            (Outcome::Replaced, child.wait_or_kill(job.kill_grace, stops.kill).await)
        }
        _ = stops.kill.cancelled() => {
            tracing::warn!("shutdown grace is over: SIGKILL to the process group");
            child.signal_group(Signal::KILL);
            (Outcome::Killed, child.wait().await)
        }
        _ = stops.lapsed.cancelled() => {
            tracing::warn!("the lease of its group slot is lost (or of its listing as going: another node may start the job's next tick beside it): SIGKILL to the process group");
            child.signal_group(Signal::KILL);
            (Outcome::Killed, child.wait().await)
        }
    };
    if outcome == Outcome::Exited && child.group_alive() {
        // A run ends with its command: what the shell left running in the background would
        // outlive the run, its record and its fence, and hold the output pipes open.
        tracing::info!("the command exited and left processes in its group: SIGTERM to the group");
        child.signal_group(Signal::TERM);
        child.end_group(job.kill_grace, stops.kill).await;
    }
    (outcome, status)
}

fn log_end(record: &RunRecord, status: &std::io::Result<ExitStatus>) {
    let (outcome, duration_ms) = (record.outcome, record.duration_ms);
    match status {
        Ok(status) if status.success() && outcome == Outcome::Exited => {
            tracing::info!(duration_ms, "run succeeded")
        }
        Ok(status) => {
            tracing::warn!(duration_ms, status = %status, outcome = outcome.as_str(), "run failed")
        }
        Err(err) => tracing::error!(error = %err, "could not wait for the command"),
    }
}

/// The `PATH` the child gets: the job's `env`, else its `env_file`, else the node's.
fn child_path<'a>(
    secrets: &'a [(String, String)],
    node_vars: &'a [(OsString, OsString)],
    job: &'a Job,
) -> Option<&'a OsStr> {
    job.env
        .get("PATH")
        .map(OsStr::new)
        .or_else(|| {
            secrets
                .iter()
                .rev()
                .find(|(name, _)| name == "PATH")
                .map(|(_, value)| OsStr::new(value))
        })
        .or_else(|| {
            node_vars
                .iter()
                .rev()
                .find(|(name, _)| name == "PATH")
                .map(|(_, value)| value.as_os_str())
        })
}

/// `sh` as the child's `PATH` finds it, by its path: the standard library looks a bare name up
/// in a `PATH` set for the child by forking the node (copying its page tables at every spawn)
/// instead of `posix_spawn`, which cost a burst of runs about half its rate. A `sh` the operator
/// put first in `PATH` still runs; without any, `/bin/sh`.
fn shell(path: Option<&OsStr>) -> PathBuf {
    path.into_iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join("sh"))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|meta| {
                meta.is_file() && std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0
            })
        })
        .unwrap_or_else(|| PathBuf::from("/bin/sh"))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_shell_is_the_first_executable_sh_of_the_childs_path_by_its_path() {
        let dir = tempfile::tempdir().expect("dir");
        let (plain, wrapped, relative) = (dir.path().join("plain"), dir.path().join("wrapped"), "bin");
        for folder in [&plain, &wrapped] {
            std::fs::create_dir(folder).expect("folder");
            std::fs::write(folder.join("sh"), "#!/bin/sh\n").expect("sh");
        }
        std::fs::set_permissions(wrapped.join("sh"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let path = std::env::join_paths([
            relative.as_ref(),
            plain.as_path(),
            wrapped.as_path(),
            "/usr/bin".as_ref(),
        ])
        .expect("PATH");
        assert_eq!(
            shell(Some(&path)),
            wrapped.join("sh"),
            "not a relative folder, nor a file that is not executable"
        );
        assert_eq!(shell(Some(OsStr::new(""))), PathBuf::from("/bin/sh"));
        assert_eq!(shell(None), PathBuf::from("/bin/sh"));
    }
}
