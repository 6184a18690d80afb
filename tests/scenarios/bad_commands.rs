//! Commands that misbehave at run time (missing, failing, flooding output, ignoring SIGTERM):
//! each result is recorded and the node keeps running within its memory.

use std::time::Duration;

use crate::support::*;
use shardcron::rules::record::Outcome;

on_both_etcds! {
    fn misbehaving_commands_are_recorded_and_the_node_keeps_running() {
        let mut world = World::new();
        let text = format!(
            r#"[cluster]
name = "test"
shards = 2
lease_ttl = "3s"

[etcd]
endpoints = ["{etcd}"]

[jobs.steady]
schedule = "* * * * * *"
command = '{record}'

[jobs.missing]
schedule = "*/2 * * * * *"
command = "shardcron-no-such-command --now"

[jobs.failing]
schedule = "*/2 * * * * *"
command = "echo failing on purpose >&2; exit 3"

[jobs.loud]
schedule = "*/5 * * * * *"
command = "head -c 3000000 /dev/zero | tr '\\000' x; echo; seq 1 20000"

[jobs.stubborn]
schedule = "*/15 * * * * *"
command = "trap '' TERM; sleep 60"
timeout = "1s"
"#,
            etcd = world.etcd.client_url(),
            record = world.record_command(),
        );
        let config = world.dir.path().join("jobs.toml");
        std::fs::write(&config, text).expect("write config");
        world.node("a", &config).start();

        wait_for(
            Duration::from_secs(60),
            "every misbehaving job has a recorded result",
            || {
                let status = world.status(&config);
                last_run(&status, "missing").is_some_and(|run| run.exit_code == Some(127))
                    && last_run(&status, "failing").is_some_and(|run| run.exit_code == Some(3))
                    && last_run(&status, "loud").is_some_and(|run| run.outcome == Outcome::Exited)
                    && last_run(&status, "stubborn").is_some_and(|run| run.outcome == Outcome::Timeout)
            },
        );
        let status = world.status(&config);
        let stubborn = last_run(&status, "stubborn").expect("stubborn's last run");
        let took = stubborn.duration_ms;
        assert!(
            (11_000..20_000).contains(&took),
            "SIGTERM at 1 s, SIGKILL 10 s later: {stubborn:?}"
        );
        let loud = last_run(&status, "loud").expect("loud's last run");
        assert_eq!(loud.exit_code, Some(0), "{loud:?}");

        let node = &mut world.nodes[0];
        assert!(
            node.child.try_wait().expect("wait").is_none(),
            "the node is still running"
        );
        let rss = node.peak_rss_mib();
        let log = node.log_text();
        assert!(
            log.contains("SIGKILL to the process group"),
            "the stubborn job is killed"
        );
        assert!(
            log.contains("failing on purpose") && log.contains("stream=\"stderr\""),
            "the job's stderr lines are in the log, tagged"
        );
        let longest = log.lines().map(str::len).max().unwrap_or_default();
        assert!(
            longest < 10 * 1024,
            "output lines are cut at 8 KiB in the log, the longest is {longest} bytes"
        );
        assert!(rss < 100.0, "the node's peak resident memory is {rss:.1} MiB");
        assert_each_tick_once(&world.runs(), "steady", 1);
        eprintln!(
            "bad commands: missing → exit 127, failing → exit 3, loud (3 MB line + 20,000 lines) → exit 0, \
             stubborn → timeout after {took} ms; node peak RSS {rss:.1} MiB, longest log line {longest} bytes"
        );
    }
}

/// Whether process `pid` exists and has not exited (a zombie has).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| Some(stat.rsplit_once(')')?.1.split_whitespace().next()? != "Z"))
        .unwrap_or(false)
}

on_both_etcds! {
    fn a_timeout_kills_what_the_command_left_running_once_kill_grace_is_over() {
        let mut world = World::new();
        let pid_file = world.dir.path().join("sleeper.pid");
        // The shell exits on SIGTERM; the process it started ignores SIGTERM and would outlive it.
        let command = format!(
            r#"(trap "" TERM; exec sh -c "echo \$\$ > {}; exec sleep 60") & wait"#,
            pid_file.display()
        );
        let config = world.write_config_tables(
            "jobs.toml",
            1,
            3,
            &[(
                "leaves-a-child",
                format!("schedule = \"*/10 * * * * *\"\ncommand = '{command}'\ntimeout = \"1s\"\nkill_grace = \"1s\""),
            )],
        );
        world.node("a", &config).start();
        wait_for(Duration::from_secs(30), "the run times out", || {
            last_run(&world.status(&config), "leaves-a-child").is_some_and(|run| run.outcome == Outcome::Timeout)
        });
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .expect("the child wrote its pid")
            .trim()
            .parse()
            .expect("a pid");
        wait_for(
            Duration::from_secs(5),
            "the child that ignores SIGTERM is killed",
            || !process_alive(pid),
        );
    }
}

on_both_etcds! {
    fn a_second_signal_kills_the_running_commands_before_the_node_exits() {
        let mut world = World::new();
        let pid_file = world.dir.path().join("long.pid");
        let command = format!("echo $$ > {}; exec sleep 60", pid_file.display());
        let config = world.write_config_tables(
            "jobs.toml",
            1,
            3,
            &[("long", format!("schedule = \"* * * * * *\"\ncommand = '{command}'"))],
        );
        let node = world.node("a", &config).start();
        wait_for(Duration::from_secs(20), "the long command runs", || pid_file.exists());
        std::thread::sleep(Duration::from_millis(200));
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .expect("pid")
            .trim()
            .parse()
            .expect("a pid");
        step("SIGTERM: a graceful stop that would wait 5 s for the command");
        world.nodes[node].signal(libc::SIGTERM);
        std::thread::sleep(Duration::from_millis(500));
        step("a second SIGTERM");
        world.nodes[node].signal(libc::SIGTERM);
        assert!(
            world.nodes[node].wait_exit(Duration::from_secs(5)).is_some(),
            "the node exits after a second signal"
        );
        assert!(!process_alive(pid), "the command was killed before the node exited");
    }
}

/// Processes a command leaves running in the background end with its run: the shell's exit
/// sends SIGTERM to the run's process group (SIGKILL after `kill_grace` to those that ignore
/// it), so nothing outlives the run, its record and its fence.
#[test]
fn what_a_command_leaves_in_the_background_ends_with_its_run() {
    let mut world = World::new();
    // Durations no other process uses, so what this test finds is its own.
    let (plain, stubborn) = (
        format!("307.{}1", std::process::id()),
        format!("307.{}2", std::process::id()),
    );
    let config = world.write_config_tables(
        "jobs.toml",
        1,
        3,
        &[(
            "leaves",
            format!(
                "schedule = \"0 0 1 1 *\"\nkill_grace = \"1s\"\n\
                 command = 'sleep {plain} & (trap \"\" TERM; exec sleep {stubborn}) & echo started'"
            ),
        )],
    );
    world.node("a", &config).start();
    wait_for(Duration::from_secs(30), "the shard is led", || {
        world.shard_leaders(&config).iter().all(|(leader, _)| leader.is_some())
    });
    let left = |what: &str| {
        std::process::Command::new("pgrep")
            .args(["-f", &format!("^sleep {what}$")])
            .output()
            .is_ok_and(|out| out.status.success())
    };
    let out = std::process::Command::new(SHARDCRON)
        .args(["trigger", "leaves", "--wait", "--config"])
        .arg(&config)
        .output()
        .expect("trigger");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    wait_for(Duration::from_secs(10), "nothing the command started is left", || {
        !left(&plain) && !left(&stubborn)
    });
}
