//! What a running node shows its HTTP API: filled by the node once it runs, read by the
//! handlers. The node imports this module; nothing here imports the node.

use std::sync::{Arc, OnceLock};

use tokio::sync::watch;

use crate::rules::config::Loaded;

/// What a running node shows its HTTP API: its etcd client and its jobs, once it has them.
#[derive(Clone, Default)]
pub struct Exposure(Arc<OnceLock<Exposed>>);

impl std::fmt::Debug for Exposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "Exposure(running)"
        } else {
            "Exposure(not yet)"
        })
    }
}

pub(crate) struct Exposed {
    pub(crate) client: etcd_client::Client,
    /// Changes when a reload replaces the node's jobs.
    pub(crate) jobs: watch::Receiver<Arc<Loaded>>,
}

impl Exposure {
    pub(crate) fn get(&self) -> Option<&Exposed> {
        self.0.get()
    }

    /// Set once, when the node runs; the API answers 503 until then.
    pub(crate) fn fill(&self, exposed: Exposed) {
        let _ = self.0.set(exposed);
    }
}
