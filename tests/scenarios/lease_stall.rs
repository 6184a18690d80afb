//! A leader cut off from etcd the way a dropping firewall cuts it (a proxy holds its bytes back):
//! its lease stalls, it stops, and another node leads within two TTLs without a stale fence.

use std::time::Duration;

use crate::support::*;

on_both_etcds! {
    fn a_leader_cut_off_from_etcd_stops_and_another_node_leads_within_two_ttl() {
        let mut world = World::new();
        let ttl = 2;
        let config = world.write_config("jobs.toml", 1, ttl, &[("tick", EVERY_SECOND, "catch_up = \"all\"")]);
        let proxies = world.start_behind_proxies(&["a", "b"], &config);
        let target = shardcron::rules::assignment::assign(1, &["a", "b"])[0]
            .clone()
            .expect("a target");
        wait_for(Duration::from_secs(20), "the target leads and runs ticks", || {
            world.runs().iter().filter(|run| run.node == target).count() >= 2
                && world
                    .status(&config)
                    .shards
                    .first()
                    .is_some_and(|shard| shard.standby == 1)
        });
        let leader = world.nodes.iter().position(|node| node.id == target).expect("ours");
        let other = world.nodes[1 - leader].id.clone();
        let (_, old_term) = world.leader_of(&config, 0).expect("a leader");

        sleep_to_mid_second();
        step(&format!("cut {target} off from etcd for 1.5×TTL"));
        let cut_at = now_secs();
        proxies[leader].cut();
        let mut led_after = None;
        while now_secs() < cut_at + 1.5 * ttl as f64 {
            if led_after.is_none() && world.leader_of(&config, 0).is_some_and(|(id, _)| id == other) {
                led_after = Some(now_secs() - cut_at);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        step("heal");
        proxies[leader].heal();
        let healed_at = now_secs();
        wait_for(Duration::from_secs(20), "runs go on for 3 s after the heal", || {
            world.runs().iter().any(|run| run.started > healed_at + 3.0)
        });

        let runs = world.runs();
        let takeover = runs
            .iter()
            .filter(|run| run.node == other && run.started > cut_at)
            .map(|run| run.started)
            .fold(f64::MAX, f64::min)
            - cut_at;
        eprintln!(
            "lease stall: status shows {other} leading {:.3} s after the cut, its first run {takeover:.3} s after (TTL {ttl} s)",
            led_after.unwrap_or(f64::NAN)
        );
        assert!(
            takeover <= 2.0 * ttl as f64,
            "{other} ran its first tick {takeover:.3} s after the cut"
        );
        assert_no_run_of_term_after(&runs, old_term, cut_at + takeover);
        assert_fences_never_go_down(&runs);
        assert_each_tick_once(&runs, "tick", 1);
        let log = world.nodes[leader].log_text();
        assert!(
            log.contains("session lost") && log.contains("reason=SessionLost"),
            "the cut leader logs why its term ended"
        );
    }
}
