//! Whether the node is ready to do its share: what `/readyz` answers and what systemd hears.
//!
//! A node is ready once it has an etcd session and stands in every shard election of its
//! config, whether or not it leads any: from then on a shard whose leader dies fails over to it.
//! Orchestrators that roll a fleet one node at a time wait for this before stopping the next.

use std::sync::Arc;

use tokio::sync::watch;

/// Where the node is on its way to ready, and why it is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// Started; not yet connected to etcd.
    Starting,
    /// etcd did not answer the last attempt; the node retries with backoff.
    EtcdUnreachable(String),
    /// Connected; opening a session and entering the shard elections.
    Campaigning,
    /// Has a session and stands in every shard election.
    Ready,
    /// The session was lost; the node opens a new one after a backoff.
    SessionLost,
    /// A signal asked the node to stop.
    Stopping,
}

impl Stage {
    /// One line for a 503 answer of `/readyz`.
    pub fn reason(&self) -> String {
        match self {
            Stage::Starting => "starting: not connected to etcd yet".to_string(),
            Stage::EtcdUnreachable(error) => format!("etcd unreachable: {error}"),
            Stage::Campaigning => "starting: entering the shard elections".to_string(),
            Stage::Ready => "ready".to_string(),
            Stage::SessionLost => "session lost: campaigning again with a new session".to_string(),
            Stage::Stopping => "stopping".to_string(),
        }
    }
}

/// The node's stage, shared by the parts that move it and the ones that report it.
#[derive(Debug, Clone)]
pub struct Readiness {
    stage: Arc<watch::Sender<Stage>>,
    /// Why a node in its stage still cannot do its share, such as etcd refusing every write:
    /// apart from the stage, which the session loop moves on its own.
    blocked: Arc<watch::Sender<Option<String>>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            stage: Arc::new(watch::Sender::new(Stage::Starting)),
            blocked: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl Readiness {
    /// Moves the node to `stage`; a node that is stopping stays so.
    pub fn set(&self, stage: Stage) {
        self.stage.send_if_modified(|current| {
            if *current == stage || *current == Stage::Stopping {
                return false;
            }
            *current = stage;
            true
        });
    }

    pub fn stage(&self) -> Stage {
        self.stage.borrow().clone()
    }

    /// Says why the node cannot do its share whatever its stage (`None`: nothing blocks it).
    pub fn set_blocked(&self, reason: Option<String>) {
        self.blocked.send_if_modified(|current| {
            let modified = *current != reason;
            *current = reason;
            modified
        });
    }

    /// Why the node is not ready, in one line; `None` when it is. What blocks it comes first,
    /// short of stopping: a node that cannot open a session because etcd is out of space says
    /// that, not the error of its last attempt.
    pub fn not_ready(&self) -> Option<String> {
        let stage = self.stage();
        if stage == Stage::Stopping {
            return Some(stage.reason());
        }
        if let Some(blocked) = self.blocked.borrow().clone() {
            return Some(blocked);
        }
        (stage != Stage::Ready).then(|| stage.reason())
    }

    /// Follows every change of stage.
    pub fn watch(&self) -> watch::Receiver<Stage> {
        self.stage.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopping_node_never_reports_ready_again() {
        let readiness = Readiness::default();
        assert_eq!(readiness.stage(), Stage::Starting);
        readiness.set(Stage::Ready);
        readiness.set(Stage::Stopping);
        readiness.set(Stage::Ready);
        assert_eq!(readiness.stage(), Stage::Stopping);
    }

    #[test]
    fn what_blocks_a_node_is_its_reason_short_of_stopping() {
        let full = Some("etcd out of space".to_string());
        for (stage, blocked, reason) in [
            (Stage::Ready, None, None),
            (Stage::Ready, full.clone(), full.clone()),
            (Stage::SessionLost, full.clone(), full.clone()),
            (Stage::Campaigning, None, Some(Stage::Campaigning.reason())),
            (Stage::Stopping, full.clone(), Some("stopping".to_string())),
        ] {
            let readiness = Readiness::default();
            readiness.set(stage.clone());
            readiness.set_blocked(blocked.clone());
            assert_eq!(readiness.not_ready(), reason, "{stage:?}, blocked by {blocked:?}");
        }
    }
}
