//! Which node should lead each shard: bounded-load rendezvous hashing over the live members.
//!
//! A pure function of the member set and the shard count, so every node computes the same
//! targets from the same fleet view, and a join or a leave moves about N/M shards.

fn score(shard: u32, node: &str) -> u64 {
    let mut bytes = shard.to_be_bytes().to_vec();
    bytes.extend_from_slice(node.as_bytes());
    seahash::hash(&bytes)
}

/// Bounded-load rendezvous hashing, decided globally: every (shard, node) pair is scored with
/// seahash, and pairs are taken from the highest score down, each shard going to the first node
/// that still has room. Room is floor(N/M), and ceil(N/M) for the first N mod M nodes to reach the
/// floor. Taking pairs in global score order (rather than shard by shard) is what keeps a join or
/// a leave from cascading: a shard only moves when a better-scored pair claims its node's room.
/// A pure function of the member set, so every node computes the same.
pub fn assign(shards: u32, members: &[&str]) -> Vec<Option<String>> {
    let mut members: Vec<&str> = members.to_vec();
    members.sort_unstable();
    members.dedup();
    let mut owners: Vec<Option<String>> = vec![None; shards as usize];
    if members.is_empty() {
        return owners;
    }
    let floor = shards as usize / members.len();
    let mut ceil_slots = shards as usize % members.len();
    let mut pairs: Vec<(u64, u32, usize)> = (0..shards)
        .flat_map(|shard| (0..members.len()).map(move |node| (shard, node)))
        .map(|(shard, node)| (score(shard, members[node]), shard, node))
        .collect();
    pairs.sort_unstable_by(|a, b| b.cmp(a));
    let mut load = vec![0usize; members.len()];
    let mut left = shards as usize;
    for (_, shard, node) in pairs {
        if left == 0 {
            break;
        }
        if owners[shard as usize].is_some() {
            continue;
        }
        if load[node] == floor {
            if ceil_slots == 0 {
                continue;
            }
            ceil_slots -= 1;
        } else if load[node] > floor {
            continue;
        }
        load[node] += 1;
        owners[shard as usize] = Some(members[node].to_string());
        left -= 1;
    }
    owners
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("node-{i}")).collect()
    }

    fn loads(assignment: &[Option<String>]) -> BTreeMap<String, usize> {
        let mut loads = BTreeMap::new();
        for owner in assignment.iter().flatten() {
            *loads.entry(owner.clone()).or_default() += 1;
        }
        loads
    }

    #[test]
    fn every_node_leads_floor_or_ceil_of_its_share() {
        for shards in [1u32, 7, 16, 64, 1024] {
            for count in 1..=9 {
                let nodes = names(count);
                let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
                let assignment = assign(shards, &refs);
                assert!(assignment.iter().all(Option::is_some));
                let loads = loads(&assignment);
                let (min, max) = (
                    loads.values().min().copied().unwrap_or(0),
                    loads.values().max().copied().unwrap_or(0),
                );
                let floor = shards as usize / count;
                let ceil = (shards as usize).div_ceil(count);
                assert!(max <= ceil, "{shards} shards over {count}: max {max} > {ceil}");
                if shards as usize >= count {
                    assert!(
                        min >= floor && loads.len() == count.min(shards as usize),
                        "{shards}/{count}: {loads:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_assignment_does_not_depend_on_member_order() {
        let a = assign(16, &["c", "a", "b"]);
        let b = assign(16, &["b", "c", "a", "a"]);
        assert_eq!(a, b);
    }

    #[test]
    fn a_join_or_leave_moves_about_n_over_m_shards() {
        let mut worst_join = 0;
        let mut total = 0;
        for trial in 0..200 {
            let nodes: Vec<String> = (0..4).map(|i| format!("host-{trial}-{i}")).collect();
            let three: Vec<&str> = nodes[..3].iter().map(String::as_str).collect();
            let four: Vec<&str> = nodes.iter().map(String::as_str).collect();
            let before = assign(16, &three);
            let after = assign(16, &four);
            let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
            worst_join = worst_join.max(moved);
            total += moved;
        }
        eprintln!(
            "a 4th node joining 16 shards: {:.2} moved on average, {worst_join} at most",
            total as f64 / 200.0
        );
        // The floor is 4 (the new node's share); cascades of displaced shards add about one.
        assert!(
            total as f64 / 200.0 <= 6.0,
            "a 4th node joining 16 shards moved {total} in 200 trials"
        );
        assert!(worst_join <= 8, "a 4th node joining 16 shards moved up to {worst_join}");
    }
}
