//! How a node enters the shard elections when its session opens: its target shards first, the
//! rest as a standby once their targets campaign.
//!
//! The oldest candidate key of a shard leads. A node that entered every election at once led
//! whatever it entered first, and a fleet of 10 nodes started together then handed over about
//! nine shards in ten, one resign and campaign each, before each node led its share. Entering in
//! target order makes the first candidate of most shards its target, so the fleet starts
//! balanced. The order only saves handoffs: whoever leads, the election is etcd's.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::coord::election::{self, Leadership};
use crate::coord::etcd::CoordError;
use crate::coord::keys::ElectionKeys;
use crate::coord::session::Session;
use crate::coord::view::FleetView;

/// The members must stay unchanged this long before a node decides which shards are its
/// targets: nodes started together register within it.
const MEMBERS_QUIET: Duration = Duration::from_millis(200);
/// Never wait longer than this for the members to settle.
const MEMBERS_WAIT: Duration = Duration::from_secs(2);
/// Never wait longer than this for other shards' targets to campaign before standing by.
const TARGETS_WAIT: Duration = Duration::from_secs(2);

/// Enters every election of `campaigns` (the numbers of those the node campaigns in), targets
/// first (see the module), and returns the candidacies.
pub(crate) async fn enter_elections(
    session: &Session,
    keys: &ElectionKeys,
    campaigns: &[u32],
    node_id: &str,
    mut view: watch::Receiver<FleetView>,
) -> Result<Vec<Leadership>, CoordError> {
    let targets = settled_targets(&mut view).await?;
    let (mine, others) = split_by_target(&targets, campaigns, node_id);
    tracing::info!(
        targets = mine.len(),
        standby = others.len(),
        members = view.borrow().members.len(),
        "entering the elections of this node's target shards first"
    );
    let mut candidacies = election::enter_all(session, keys, &mine, node_id).await?;
    let deadline = Instant::now() + TARGETS_WAIT;
    while !targets_campaign(&view.borrow_and_update(), &others) {
        match tokio::time::timeout_at(deadline, view.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(CoordError::Protocol("the fleet view ended".into())),
            Err(_) => {
                tracing::info!(
                    wait = ?TARGETS_WAIT,
                    "not every other shard's target campaigns yet: standing by anyway"
                );
                break;
            }
        }
    }
    candidacies.extend(election::enter_all(session, keys, &others, node_id).await?);
    Ok(candidacies)
}

/// The shard targets once the view's members have been read and stayed unchanged for
/// [`MEMBERS_QUIET`], or [`MEMBERS_WAIT`] has passed.
async fn settled_targets(
    view: &mut watch::Receiver<FleetView>,
) -> Result<std::sync::Arc<Vec<Option<String>>>, CoordError> {
    let deadline = Instant::now() + MEMBERS_WAIT;
    // The view starts empty, before its first read of etcd.
    while view.borrow_and_update().members.is_empty() {
        match tokio::time::timeout_at(deadline, view.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(CoordError::Protocol("the fleet view ended".into())),
            Err(_) => return Ok(view.borrow().targets.clone()),
        }
    }
    let mut members = view.borrow().members.clone();
    let mut quiet_until = Instant::now() + MEMBERS_QUIET;
    loop {
        match tokio::time::timeout_at(quiet_until.min(deadline), view.changed()).await {
            Ok(Ok(())) => {
                let now = view.borrow_and_update().members.clone();
                if now != members {
                    members = now;
                    quiet_until = Instant::now() + MEMBERS_QUIET;
                }
            }
            Ok(Err(_)) => return Err(CoordError::Protocol("the fleet view ended".into())),
            Err(_) => return Ok(view.borrow().targets.clone()),
        }
    }
}

/// The shards whose target is `me`, and the others. Shards without a target (no member of this
/// shard count yet) are `me`'s: nobody else will lead them sooner.
fn split_by_target(targets: &[Option<String>], campaigns: &[u32], me: &str) -> (Vec<u32>, Vec<u32>) {
    campaigns.iter().copied().partition(|shard| {
        targets
            .get(*shard as usize)
            .and_then(Option::as_deref)
            .is_none_or(|target| target == me)
    })
}

/// Whether the target of each of `shards` is a candidate in its election, as `view` sees them.
fn targets_campaign(view: &FleetView, shards: &[u32]) -> bool {
    shards.iter().all(
        |shard| match view.targets.get(*shard as usize).and_then(Option::as_ref) {
            Some(target) => view
                .candidates
                .get(*shard as usize)
                .is_some_and(|candidates| candidates.contains(target)),
            None => true,
        },
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_node_enters_its_targets_first_and_stands_by_once_the_others_campaign() {
        let targets = vec![
            Some("a".to_string()),
            Some("b".to_string()),
            None,
            Some("a".to_string()),
        ];
        assert_eq!(split_by_target(&targets, &[0, 1, 2, 3], "a"), (vec![0, 2, 3], vec![1]));
        assert_eq!(split_by_target(&targets, &[1, 2], "a"), (vec![2], vec![1]));
        assert_eq!(split_by_target(&[], &[0, 1], "a"), (vec![0, 1], vec![]));
        let view = |campaigning: &[&[&str]]| FleetView {
            targets: Arc::new(targets.clone()),
            candidates: campaigning
                .iter()
                .map(|ids| ids.iter().map(|id| id.to_string()).collect::<BTreeSet<_>>())
                .collect(),
            ..FleetView::default()
        };
        assert!(!targets_campaign(&view(&[&["a"], &["a"], &[], &["a"]]), &[1]));
        assert!(targets_campaign(&view(&[&["a"], &["a", "b"], &[], &["a"]]), &[1]));
        assert!(
            targets_campaign(&view(&[&[], &[], &[], &[]]), &[2]),
            "no target, no wait"
        );
    }
}
