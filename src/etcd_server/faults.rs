//! What tests do to a running throwaway etcd: kill, stall, stop, restart or upgrade a member,
//! and read which one leads, which are unwell and what their metrics say.

use std::path::Path;
use std::time::Duration;

use super::{EtcdServer, EtcdServerError};

impl EtcdServer {
    /// Kills every member and keeps the data, so [`EtcdServer::restart`] comes back with the same
    /// state.
    pub fn kill(&mut self) {
        for index in 0..self.members.len() {
            self.kill_member(index);
        }
    }

    pub fn kill_member(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stalls member `index` (SIGSTOP): it keeps its connections and answers nothing, as a
    /// member hung on a slow disk does.
    pub fn stall_member(&self, index: usize) {
        self.signal_member(index, libc::SIGSTOP);
    }

    /// Lets a member stalled by [`EtcdServer::stall_member`] go on (SIGCONT).
    pub fn resume_member(&self, index: usize) {
        self.signal_member(index, libc::SIGCONT);
    }

    fn signal_member(&self, index: usize, signal: libc::c_int) {
        if let Some(child) = &self.members[index].child {
            // SAFETY: kill(2) on the pid of a child this server spawned and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        }
    }

    /// Starts every stopped member again on the same ports and data.
    pub fn restart(&mut self) -> Result<(), EtcdServerError> {
        for index in 0..self.members.len() {
            self.restart_member(index)?;
        }
        Ok(())
    }

    /// Stops member `index` as an operator does (SIGTERM: it hands raft leadership on if it
    /// holds it) and waits for it to exit; its data stays for [`EtcdServer::restart_member`].
    pub fn terminate_member(&mut self, index: usize) {
        if let Some(mut child) = self.members[index].child.take() {
            // SAFETY: kill(2) on the pid of a child this server spawned and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = child.wait();
        }
    }

    /// Starts a stopped member again on its ports and data, and waits until it answers healthy.
    pub fn restart_member(&mut self, index: usize) -> Result<(), EtcdServerError> {
        if self.members[index].child.is_none() {
            self.spawn(index)?;
            self.wait_healthy(index, Duration::from_secs(30))?;
        }
        Ok(())
    }

    /// Upgrades member `index` in place, as an operator does: stops it with SIGTERM, starts
    /// `bin` on its ports and data, and waits until it answers healthy.
    pub fn upgrade_member(&mut self, index: usize, bin: &Path) -> Result<(), EtcdServerError> {
        self.terminate_member(index);
        self.members[index].bin = Some(bin.to_path_buf());
        self.restart_member(index)
    }

    /// The index of the member that is raft leader now, if any answers so.
    pub fn leader_member(&self) -> Option<usize> {
        (0..self.members.len()).find(|&index| self.metric_of(index, "etcd_server_is_leader") == Some(1.0))
    }

    /// Members whose process has exited or that do not answer healthy, each with its log's tail:
    /// what a test checks before it injects a fault of its own.
    pub fn unwell_members(&mut self) -> Vec<String> {
        (0..self.members.len())
            .filter_map(|index| {
                let exited = self.members[index]
                    .child
                    .as_mut()
                    .is_none_or(|child| !matches!(child.try_wait(), Ok(None)));
                let healthy = self
                    .http_get(index, "/health")
                    .is_some_and(|body| body.contains("\"health\":\"true\""));
                (exited || !healthy).then(|| self.log_tail(index, exited))
            })
            .collect()
    }

    /// Every member's log tail, for a failing test's output.
    pub fn log_tails(&self) -> Vec<String> {
        (0..self.members.len())
            .map(|index| self.log_tail(index, false))
            .collect()
    }

    fn log_tail(&self, index: usize, exited: bool) -> String {
        let log = std::fs::read_to_string(self.log_path_of(index)).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        // A Go panic's cause is its first line, above a stack trace longer than any tail.
        let from = lines
            .iter()
            .position(|line| line.starts_with("panic:") || line.starts_with("fatal error:"))
            .unwrap_or(lines.len().saturating_sub(15));
        let tail = lines[from..lines.len().min(from + 40)].join("\n");
        format!(
            "{}{}:\n{tail}",
            self.members[index].name,
            if exited { " (exited)" } else { "" }
        )
    }

    /// The value of a counter or gauge on the first member's `/metrics` page, summed over its
    /// label sets.
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metric_of(0, name)
    }

    fn metric_of(&self, index: usize, name: &str) -> Option<f64> {
        let page = self.http_get(index, "/metrics")?;
        let values: Vec<f64> = page
            .lines()
            .filter(|line| {
                line.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse().ok())
            .collect();
        (!values.is_empty()).then(|| values.iter().sum())
    }
}
