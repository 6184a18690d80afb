//! `shardcron dev`: a throwaway etcd, one node, the jobs run; Ctrl-C stops it all and cleans up.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

#[test]
fn dev_runs_jobs_against_a_throwaway_etcd_and_cleans_up_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("runs.log");
    let config = dir.path().join("jobs.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nname = \"dev\"\nshards = 2\nlease_ttl = \"3s\"\n\n[etcd]\nendpoints = [\"http://127.0.0.1:1\"]\n\n\
             [jobs.hello]\nschedule = \"* * * * * *\"\ncommand = 'echo \"$CRON_JOB $CRON_SCHEDULED_AT $CRON_FENCE $CRON_NODE $CRON_SHARD $(date +%s.%N)\" >> {}'\n",
            out.display()
        ),
    )
    .unwrap();
    let log = dir.path().join("dev.log");
    let mut child = Command::new(SHARDCRON)
        .args(["dev", "--node-id", "dev-node", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for(Duration::from_secs(30), "the job runs twice", || {
        read_runs(&out).len() >= 2
    });
    let runs = read_runs(&out);
    assert!(
        runs.iter().all(|run| run.job == "hello" && run.node == "dev-node"),
        "{runs:?}"
    );

    step("pause and resume the job through dev's etcd");
    let started = std::fs::read_to_string(&log).unwrap();
    let endpoint = started
        .split("endpoint=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("dev logs its etcd's endpoint")
        .to_owned();
    for verb in ["pause", "resume"] {
        let done = Command::new(SHARDCRON)
            .args([verb, "hello", "--endpoints", &endpoint, "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(
            done.status.success(),
            "{verb}: {}",
            String::from_utf8_lossy(&done.stderr)
        );
    }
    wait_for(Duration::from_secs(10), "the node saw the pause", || {
        std::fs::read_to_string(&log).unwrap().contains("pause changed")
    });

    step("Ctrl-C");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "dev did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(status.success(), "{text}");
    assert!(
        text.contains("lease revoked"),
        "the node resigned through the still-running etcd:\n{text}"
    );
    let etcd_dir = text
        .split("log=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|path| std::path::Path::new(path).parent().map(|dir| dir.to_path_buf()))
        .expect("the etcd log path is logged");
    assert!(!etcd_dir.exists(), "{} is removed", etcd_dir.display());
    // Logs print values, not Rust's debug text, nor the transport's dump (#45).
    for line in text.lines().filter(|line| line.contains(" INFO ")) {
        for debug in ["Some(", "None", "tonic::", "Transport"] {
            assert!(!line.contains(debug), "an info line prints {debug}: {line}");
        }
    }
}
