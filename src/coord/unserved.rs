//! The `run_on` sets no live node has all the tags of, and since when: every node watches the
//! members, and the first to see a set lose its last node marks it in etcd, so `status` can say
//! since when nobody runs its jobs. The mark goes when a node with those tags comes back. Also
//! this node's `shardcron_jobs_without_eligible_node`.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::coord::etcd::{self, CoordError};
use crate::coord::keys::Keys;
use crate::coord::session::Session;
use crate::coord::view::FleetView;
use crate::rules::pools::Tags;
use crate::rules::record::Member;

/// The value of `/unserved/<tags>`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mark {
    since: DateTime<Utc>,
    /// The node that saw the last one go.
    by: String,
}

/// Every mark, by `run_on` id; marks that do not parse are left out.
pub(crate) async fn read(
    client: &etcd_client::Client,
    keys: &Keys,
) -> Result<HashMap<String, DateTime<Utc>>, CoordError> {
    let prefix = keys.unserved_prefix();
    let (read, _) = etcd::read_prefix(client, &prefix).await?;
    Ok(read
        .iter()
        .filter_map(|kv| {
            let id = kv.key_str().ok()?.strip_prefix(&prefix)?.to_string();
            let mark: Mark = serde_json::from_slice(kv.value()).ok()?;
            Some((id, mark.since))
        })
        .collect())
}

/// Whether no member has all of `tags`, which are some jobs' `run_on`: nobody may run them.
fn nobody_has(tags: &Tags, members: &BTreeMap<String, Member>) -> bool {
    !tags.is_empty() && !members.values().any(|member| member.tags.has_all(tags))
}

/// The sets of `run_on` (with how many jobs run on each) that no member has all the tags of.
pub(crate) fn unserved<'a>(
    run_on: &'a BTreeMap<Tags, usize>,
    members: &'a BTreeMap<String, Member>,
) -> impl Iterator<Item = (&'a Tags, usize)> + 'a {
    run_on
        .iter()
        .filter(|(tags, _)| nobody_has(tags, members))
        .map(|(tags, jobs)| (tags, *jobs))
}

/// Of `run_on`, the sets no member has, by id, each with since when as `marks` (from [`read`])
/// say it: what `status` shows.
pub(crate) fn since<'a>(
    run_on: impl IntoIterator<Item = &'a Tags>,
    members: &BTreeMap<String, Member>,
    marks: &HashMap<String, DateTime<Utc>>,
) -> HashMap<String, Option<DateTime<Utc>>> {
    run_on
        .into_iter()
        .filter(|tags| nobody_has(tags, members))
        .map(|tags| (tags.id(), marks.get(&tags.id()).copied()))
        .collect()
}

/// Keeps the marks and the gauge current from this session's view of the members until the
/// session ends. `run_on` comes from the node's jobs at each change.
pub(crate) async fn keep(
    session: Session,
    keys: Keys,
    node: String,
    mut jobs: watch::Receiver<std::sync::Arc<crate::rules::config::Loaded>>,
    mut view: watch::Receiver<FleetView>,
) {
    // What this node last made etcd say, by id: a mark it put, or found, or removed.
    let mut marked: BTreeSet<String> = BTreeSet::new();
    let mut known = false;
    loop {
        let (now_unserved, every_set) = {
            let current = view.borrow_and_update();
            let loaded = jobs.borrow_and_update();
            if current.members.is_empty() {
                (None, BTreeSet::new())
            } else {
                let now: BTreeMap<String, usize> = unserved(&loaded.run_on, &current.members)
                    .map(|(tags, count)| (tags.id(), count))
                    .collect();
                let every: BTreeSet<String> = loaded.run_on.keys().map(Tags::id).collect();
                (Some(now), every)
            }
        };
        if let Some(now_unserved) = now_unserved {
            crate::metrics::get()
                .jobs_without_eligible_node
                .set(now_unserved.values().sum::<usize>() as i64);
            if !known {
                match read(&session.client(), &keys).await {
                    Ok(marks) => {
                        marked = marks.into_keys().filter(|id| every_set.contains(id)).collect();
                        known = true;
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "cannot read the marks of run_on sets without a node yet")
                    }
                }
            }
            if known {
                if let Err(err) = mark(&session, &keys, &node, &now_unserved, &every_set, &mut marked).await {
                    tracing::debug!(error = %err, "cannot update the marks of run_on sets without a node yet");
                }
            }
        }
        tokio::select! {
            changed = view.changed() => if changed.is_err() { return },
            changed = jobs.changed() => if changed.is_err() { return },
            _ = session.ended().cancelled() => return,
        }
    }
}

/// Puts a mark for each newly unserved set (unless another node did first) and removes the
/// marks of sets a node serves again.
async fn mark(
    session: &Session,
    keys: &Keys,
    node: &str,
    now_unserved: &BTreeMap<String, usize>,
    every_set: &BTreeSet<String>,
    marked: &mut BTreeSet<String>,
) -> Result<(), CoordError> {
    let client = session.client();
    for (id, jobs) in now_unserved {
        if marked.contains(id) {
            continue;
        }
        let key = keys.unserved(id);
        let value = serde_json::to_vec(&Mark {
            since: crate::clock::now(),
            by: node.to_string(),
        })
        .map_err(|err| CoordError::Protocol(err.to_string()))?;
        let put = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.as_str(), value, None)]);
        if etcd::call(client.clone().txn(put)).await?.succeeded() {
            tracing::warn!(run_on = %id, jobs, "no live node has all of these tags: nobody runs the jobs that run on them until one comes");
        }
        marked.insert(id.clone());
    }
    let served: Vec<String> = marked
        .iter()
        .filter(|id| !now_unserved.contains_key(*id) && every_set.contains(*id))
        .cloned()
        .collect();
    for id in served {
        let key = keys.unserved(&id);
        let remove = Txn::new()
            .when([Compare::version(key.as_str(), CompareOp::Greater, 0)])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        if etcd::call(client.clone().txn(remove)).await?.succeeded() {
            tracing::info!(run_on = %id, "a live node has all of these tags again: its jobs run");
        }
        marked.remove(&id);
    }
    Ok(())
}
