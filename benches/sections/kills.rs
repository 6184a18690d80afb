//! Ticks lost and doubled by SIGKILLs of a leader around its ticks.

use crate::common::*;

/// `kills` SIGKILLs of a shard's leader at random offsets from 50 ms before to 100 ms after a
/// tick, per delivery mode: of the ticks claimed by the kill (the last one due, and for
/// at-least-once, which claims an instant ahead, the next one too), how many never ran without
/// a `lost` record, how many were recorded lost, and how many ran twice. The killed node restarts
/// and takes its shard back before the next kill.
pub(crate) fn bench_kills(kills: usize) {
    println!("\n### {kills} SIGKILLs of a leader around a tick (8 per-second jobs, one shard, TTL 1 s, catch_up = \"none\")\n");
    println!("| delivery | kills | (job, tick) checked | lost without a record | recorded lost | ran twice | repeats with a higher fence |");
    println!("|---|---|---|---|---|---|---|");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |since| since.as_nanos() as u64);
    let mut random = seed | 1;
    let mut next_offset = move || {
        // xorshift64: offsets only need to be spread, not unpredictable.
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        (random % 151) as i64 - 50
    };
    let only = std::env::var("SHARDCRON_BENCH_DELIVERY").ok();
    for delivery in ["at-least-once", "at-most-once"] {
        if only.as_deref().is_some_and(|only| only != delivery) {
            continue;
        }
        let mut world = World::new();
        let names = job_names(8, 1);
        let extra = format!("catch_up = \"none\"\ndelivery = \"{delivery}\"");
        let config = world.write_config("jobs.toml", 1, 1, &every_second(&names, &extra));
        let roles = world.leader_and_standby(&config);
        let leader_id = world.nodes[roles.leader].id.clone();
        let aimed = kill_around_ticks(
            &mut world,
            &config,
            &leader_id,
            &names,
            delivery,
            kills,
            &mut next_offset,
        );
        let Tally {
            lost,
            recorded_lost,
            doubled,
            fenced,
        } = tally(&world, &names, &aimed);
        println!(
            "| {delivery} | {kills} | {} | {lost} | {recorded_lost} | {doubled} | {fenced} |",
            aimed.len() * names.len()
        );
    }
}

/// `kills` SIGKILLs of the node `leader_id` at offsets `next_offset` gives, each followed by its
/// restart once the standby ran every job; the ticks each kill claimed.
fn kill_around_ticks(
    world: &mut World,
    config: &Path,
    leader_id: &str,
    names: &[String],
    delivery: &str,
    kills: usize,
    next_offset: &mut impl FnMut() -> i64,
) -> Vec<DateTime<Utc>> {
    let mut aimed = Vec::new();
    for kill in 0..kills {
        let leader = world
            .nodes
            .iter()
            .rposition(|node| node.id == leader_id)
            .expect("the leader");
        let offset = next_offset();
        let tick = sleep_to_tick_offset(offset);
        world.nodes[leader].signal(libc::SIGKILL);
        if offset >= 0 {
            aimed.push(tick);
        } else {
            aimed.push(tick - chrono::Duration::seconds(1));
            if delivery == "at-least-once" {
                aimed.push(tick);
            }
        }
        let killed_at = now_secs();
        wait_for(Duration::from_secs(20), "the standby runs every job", || {
            every_job_ran_since(&world.runs(), names, killed_at + 0.5, 1)
        });
        let restarted_at = now_secs();
        world.node(leader_id, config).start();
        // A tick of its own after the restart, not a start of the killed process that the
        // kill raced: until then the shard may still be between leaders, and a tick of that
        // gap is caught up as `catch_up = "none"` says, which is not at all.
        wait_for(Duration::from_secs(20), "the restarted node leads again", || {
            world.status(config).shards[0].leader.as_deref() == Some(leader_id)
                && world
                    .runs()
                    .iter()
                    .any(|run| run.node == leader_id && run.tick.timestamp() as f64 > restarted_at)
        });
        if (kill + 1) % 10 == 0 {
            eprintln!("{delivery}: {} kills", kill + 1);
        }
    }
    aimed
}

/// What became of each (job, aimed tick).
struct Tally {
    /// Never ran, and no node logged it lost.
    lost: usize,
    recorded_lost: usize,
    /// Runs after the first of a (job, tick).
    doubled: usize,
    /// Of those, runs with a higher fence than the one before.
    fenced: usize,
}

fn tally(world: &World, names: &[String], aimed: &[DateTime<Utc>]) -> Tally {
    let runs = world.runs();
    // One log file per node id, appended to by each of its processes.
    let mut log_files: Vec<&Path> = world.nodes.iter().map(|node| node.log.as_path()).collect();
    log_files.sort();
    log_files.dedup();
    let logs: String = log_files
        .iter()
        .map(|log| std::fs::read_to_string(log).unwrap_or_default())
        .collect();
    let (mut lost, mut recorded_lost, mut doubled, mut fenced) = (0, 0, 0, 0);
    for name in names {
        for tick in aimed {
            let mut ran: Vec<&Run> = runs
                .iter()
                .filter(|run| &run.job == name && run.tick == *tick)
                .collect();
            ran.sort_by(|a, b| a.started.total_cmp(&b.started));
            if ran.is_empty() {
                let recorded = logs.lines().any(|line| {
                    line.contains("lost:")
                        && line.contains(&format!("job={name} "))
                        && line.contains(&format!("tick={tick}"))
                });
                if recorded {
                    recorded_lost += 1;
                } else {
                    lost += 1;
                    // What the nodes said of that instant, for whoever reads the table.
                    let seconds: Vec<String> = [-2, -1, 0]
                        .iter()
                        .map(|delta| {
                            (*tick + chrono::Duration::seconds(*delta))
                                .format("%Y-%m-%dT%H:%M:%S")
                                .to_string()
                        })
                        .collect();
                    eprintln!("{name}: tick {tick} never ran and was not recorded lost; the nodes' lines of the 2 s before it:");
                    for line in logs
                        .lines()
                        .filter(|line| seconds.iter().any(|second| line.starts_with(second.as_str())))
                    {
                        eprintln!("  {line}");
                    }
                }
            }
            for pair in ran.windows(2) {
                doubled += 1;
                if pair[1].fence > pair[0].fence {
                    fenced += 1;
                }
            }
        }
    }
    Tally {
        lost,
        recorded_lost,
        doubled,
        fenced,
    }
}
