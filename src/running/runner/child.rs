//! A run's command as a process: spawned in a process group of its own, which is what a stop,
//! a timeout and a dropped run signal, so nothing the command started outlives it.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::ExitStatus;
use std::time::Duration;

use rustix::process::{Pid, Signal};
use tokio::process::{ChildStderr, ChildStdout};
use tokio_util::sync::CancellationToken;

/// A started command, the leader of its own process group.
pub(super) struct Child {
    process: tokio::process::Child,
    pid: Pid,
    /// Set once the child is reaped: from then on its pid, and so its group's id, may be
    /// another process's, and the group is never signalled again.
    reaped: bool,
}

impl Child {
    /// Starts `command`, whose stdout and stderr must be piped, in a process group of its own.
    /// The spawn stays a `posix_spawn`: nothing runs in the child between fork and exec.
    pub(super) fn spawn(mut command: std::process::Command) -> io::Result<Child> {
        command.process_group(0);
        let mut process = tokio::process::Command::from(command).spawn()?;
        let Some(pid) = process.id().and_then(|id| Pid::from_raw(id as i32)) else {
            // Only a child already reaped has no pid, and none is reaped before it is waited for.
            let _ = process.start_kill();
            return Err(io::Error::other("the spawned command has no pid"));
        };
        Ok(Child {
            process,
            pid,
            reaped: false,
        })
    }

    /// The child's pid, which is also its process group's id.
    pub(super) fn pid(&self) -> Pid {
        self.pid
    }

    pub(super) fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.process.stdout.take()
    }

    pub(super) fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.process.stderr.take()
    }

    /// Waits for the child to exit and reaps it; again after that, the same status.
    pub(super) async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.process.wait().await;
        self.reaped |= status.is_ok();
        status
    }

    /// Whether any process of the child's group still exists.
    pub(super) fn group_alive(&self) -> bool {
        rustix::process::test_kill_process_group(self.pid).is_ok()
    }

    /// Signals every process of the child's group. A group that is gone already is not an
    /// error: its processes ended on their own.
    pub(super) fn signal_group(&self, signal: Signal) {
        let _ = rustix::process::kill_process_group(self.pid, signal);
    }

    /// After a SIGTERM: waits `grace` for the command to exit, then SIGKILLs its process group.
    ///
    /// The shell exiting is not enough: a process it started may ignore SIGTERM and keep the
    /// group alive, so the group itself is watched until it is gone or the grace is over.
    pub(super) async fn wait_or_kill(&mut self, grace: Duration, kill: &CancellationToken) -> io::Result<ExitStatus> {
        let deadline = tokio::time::Instant::now() + grace;
        let status = tokio::select! {
            status = self.wait() => status,
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!("still running after SIGTERM: SIGKILL to the process group");
                self.signal_group(Signal::KILL);
                return self.wait().await;
            }
            _ = kill.cancelled() => {
                self.signal_group(Signal::KILL);
                return self.wait().await;
            }
        };
        self.end_group(deadline.saturating_duration_since(tokio::time::Instant::now()), kill)
            .await;
        status
    }

    /// Once a SIGTERM went to the group of a command that exited: waits `grace` for the
    /// processes it started to end, then SIGKILLs the group.
    pub(super) async fn end_group(&self, grace: Duration, kill: &CancellationToken) {
        let deadline = tokio::time::Instant::now() + grace;
        while self.group_alive() {
            tokio::select! {
                _ = tokio::time::sleep(GROUP_POLL) => {}
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::warn!("the command exited but a process it started ignores SIGTERM: SIGKILL to the process group");
                    self.signal_group(Signal::KILL);
                    break;
                }
                _ = kill.cancelled() => {
                    self.signal_group(Signal::KILL);
                    break;
                }
            }
        }
    }
}

impl Drop for Child {
    /// A run dropped before its command exited (its task was cancelled) kills the command's
    /// whole group; tokio reaps the child in the background, so no zombie stays.
    fn drop(&mut self) {
        if !self.reaped {
            self.signal_group(Signal::KILL);
        }
    }
}

/// How often a process group that outlived its shell is checked during the kill grace.
const GROUP_POLL: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use tokio::io::AsyncReadExt;

    use super::*;

    fn sh(script: &str) -> std::process::Command {
        let mut command = std::process::Command::new("sh");
        command
            .arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    fn exists(pid: Pid) -> bool {
        rustix::process::test_kill_process(pid).is_ok()
    }

    #[tokio::test]
    async fn a_command_gives_its_output_streams_and_exit_status() {
        let mut child = Child::spawn(sh("echo out; echo err >&2; exit 3")).expect("spawn");
        let (mut out, mut err) = (String::new(), String::new());
        child.take_stdout().unwrap().read_to_string(&mut out).await.unwrap();
        child.take_stderr().unwrap().read_to_string(&mut err).await.unwrap();
        assert_eq!((out.as_str(), err.as_str()), ("out\n", "err\n"));
        assert_eq!(child.wait().await.unwrap().code(), Some(3));
        assert_eq!(child.wait().await.unwrap().code(), Some(3), "the same status again");
        assert_eq!(rustix::process::getpgid(Some(child.pid())).ok(), None, "reaped");
    }

    #[tokio::test]
    async fn a_command_leads_its_own_process_group() {
        let mut child = Child::spawn(sh("sleep 5")).expect("spawn");
        assert_eq!(rustix::process::getpgid(Some(child.pid())).unwrap(), child.pid());
        child.signal_group(Signal::KILL);
        assert!(child.wait().await.is_ok());
        // A process the shell forked is reaped by whoever adopted it, a moment after the shell.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while child.group_alive() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!child.group_alive(), "the whole group is gone");
    }

    #[tokio::test]
    async fn a_dropped_command_is_killed_with_its_group() {
        let mut child = Child::spawn(sh("sleep 30 & echo $!; wait")).expect("spawn");
        let mut stdout = child.take_stdout().unwrap();
        let mut line = Vec::new();
        while !line.ends_with(b"\n") {
            let mut byte = [0; 1];
            assert_eq!(stdout.read(&mut byte).await.unwrap(), 1);
            line.push(byte[0]);
        }
        let background = Pid::from_raw(String::from_utf8(line).unwrap().trim().parse().unwrap()).unwrap();
        let pid = child.pid();
        drop(child);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while (exists(pid) || exists(background)) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!exists(background), "the process the command started is killed");
        assert!(!exists(pid), "the command is killed and reaped");
    }
}
