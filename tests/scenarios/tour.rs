//! README.md's five-minute tour, run from the README's own text: every command it shows, pasted
//! as shown (through `sh`, with `shardcron` on the `PATH`, from the checkout), must succeed and
//! print what the README shows, compared by shape (numbers, instants, ids and column widths
//! aside; a table's header exactly, its rows by their first column). So the README cannot drift
//! from the program again. The tour's own steps: a `dev` node, its commands, Ctrl-C; then `dev
//! --nodes 3`, one node SIGKILLed as the README says, its shards moving, and every heartbeat tick
//! of the window run once.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// A command of the tour and what the README shows it printing; a block with no command shows
/// more of the running `dev`'s output.
#[derive(Debug)]
struct Step {
    command: Option<String>,
    shown: Vec<String>,
}

/// The console blocks of the README's tour, as steps.
fn tour_steps(readme: &str) -> Vec<Step> {
    let start = readme.find("## A five-minute tour").expect("README has its tour");
    let tour = &readme[start..];
    let tour = &tour[..tour[3..].find("\n## ").map_or(tour.len(), |end| end + 3)];
    let mut steps = Vec::new();
    let mut in_block = false;
    for line in tour.lines() {
        if line.starts_with("```") {
            in_block = line == "```console";
            if in_block {
                steps.push(Step {
                    command: None,
                    shown: Vec::new(),
                });
            }
            continue;
        }
        if !in_block {
            continue;
        }
        match line.strip_prefix("$ ") {
            Some(command) => {
                if steps
                    .last()
                    .is_some_and(|step| step.command.is_some() || !step.shown.is_empty())
                {
                    steps.push(Step {
                        command: None,
                        shown: Vec::new(),
                    });
                }
                steps.last_mut().unwrap().command = Some(command.to_string());
            }
            None => steps.last_mut().unwrap().shown.push(line.to_string()),
        }
    }
    steps.retain(|step| step.command.is_some() || !step.shown.is_empty());
    steps
}

/// A line with what changes from run to run replaced: the host name by the README's `vm`, runs
/// of 8 or more hex digits (ids, digests, leases) by `H`, other numbers by `N`, blanks by one.
fn normalized(line: &str, host: &str) -> String {
    let line = if host == "vm" {
        line.to_string()
    } else {
        line.split(' ')
            .map(|word| if word == host { "vm" } else { word })
            .collect::<Vec<_>>()
            .join(" ")
            .replace(&format!("node={host}"), "node=vm")
    };
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        let hex_run = chars[i..].iter().take_while(|c| c.is_ascii_hexdigit()).count();
        let starts_word = i == 0 || !chars[i - 1].is_ascii_alphanumeric();
        if hex_run >= 8 && starts_word && chars[i..i + hex_run].iter().any(char::is_ascii_digit) {
            out.push('H');
            i += hex_run;
        } else if chars[i].is_ascii_digit() {
            out.push('N');
            i += chars[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    // A progress bar on a terminal, a line per step elsewhere: the same line either way.
    let out = out.replace(": N/N done", " N/N done");
    let out = match (out.find(" ["), out.find("] ")) {
        (Some(open), Some(close))
            if open < close && out[open + 2..close].chars().all(|c| matches!(c, '#' | '-' | '.' | ' ')) =>
        {
            format!("{}{}", &out[..open], &out[close + 1..])
        }
        _ => out,
    };
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What a log line says, without its time, span fields and values: its level, target and
/// message (the words before the first `key=value`).
fn log_kind(line: &str) -> Option<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let level = words
        .iter()
        .position(|word| matches!(*word, "TRACE" | "DEBUG" | "INFO" | "WARN" | "ERROR"))?;
    let target = words[level..]
        .iter()
        .position(|word| word.starts_with("shardcron::") && word.ends_with(':'))?
        + level;
    let message: Vec<&str> = words[target + 1..]
        .iter()
        .take_while(|word| !word.contains('='))
        .copied()
        .collect();
    Some(format!("{} {} {}", words[level], words[target], message.join(" ")))
}

fn is_header(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    words.len() >= 2 && words.iter().all(|word| word.chars().all(|c| c.is_ascii_uppercase()))
}

/// The shapes of an output's lines: a log line by [`log_kind`], a table's header as it is and
/// each row as its header and first column, any other line [`normalized`].
fn shapes(lines: &[String], host: &str) -> BTreeSet<String> {
    let mut shapes = BTreeSet::new();
    let mut header: Option<String> = None;
    for line in lines {
        let line = line.strip_prefix("dev-").map_or(line.as_str(), |rest| {
            rest.split_once(" | ").map_or(line.as_str(), |(_, after)| after)
        });
        if line.trim().is_empty() {
            header = None;
            continue;
        }
        if line.trim() == "..." {
            continue;
        }
        if let Some(kind) = log_kind(line) {
            shapes.insert(kind);
        } else if is_header(line) {
            let shown = normalized(line, host);
            shapes.insert(format!("header {shown}"));
            header = Some(shown);
        } else if let Some(header) = &header {
            let first = normalized(line, host).split(' ').next().unwrap_or_default().to_string();
            shapes.insert(format!("{header} | {first}"));
        } else {
            shapes.insert(normalized(line, host));
        }
    }
    shapes
}

/// A running `dev`: its process, and the file its output goes to.
struct Dev {
    child: Child,
    output: tempfile::TempPath,
}

impl Dev {
    fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }

    fn lines(&self) -> Vec<String> {
        self.output().lines().map(String::from).collect()
    }

    /// Ctrl-C, as in the terminal: the nodes stop, then etcd, whose directory is removed. A
    /// node whose command still goes (`slow-export` runs 12 s of every 10) waits for it and says
    /// so: a second Ctrl-C, as that line says, stops it now.
    fn interrupt(mut self) -> String {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGINT) };
        let waiting = "waiting for running commands to end within the grace; Ctrl-C (or SIGTERM) again stops them now";
        let _ = wait_within(Duration::from_secs(15), || {
            matches!(self.child.try_wait(), Ok(Some(_))) || self.output().contains(waiting)
        });
        let hurried = matches!(self.child.try_wait(), Ok(None)) && self.output().contains(waiting);
        println!(
            "Ctrl-C {}",
            if hurried {
                "twice: a command went on in the grace"
            } else {
                "once"
            }
        );
        if hurried {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "dev did not stop on Ctrl-C:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let text = self.output();
        assert!(status.success(), "dev exits 0 on Ctrl-C ({status}):\n{text}");
        if hurried {
            assert!(
                text.contains("second signal: killing the remaining commands now"),
                "the second Ctrl-C stopped the running commands at once:\n{text}"
            );
        }
        assert!(
            text.contains("lease revoked"),
            "the nodes resigned through the still-running etcd:\n{text}"
        );
        let etcd_dir = text
            .split("log=")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|path| Path::new(path).parent().map(Path::to_path_buf))
            .expect("the etcd log path is logged");
        assert!(!etcd_dir.exists(), "{} is removed", etcd_dir.display());
        // Logs print values, not Rust's debug text, nor the transport's dump (#45).
        for line in text.lines().filter(|line| line.contains(" INFO ")) {
            for debug in ["Some(", "None", "tonic::", "Transport"] {
                assert!(!line.contains(debug), "an info line prints {debug}: {line}");
            }
        }
        text
    }
}

/// Where the tour's commands run: the checkout, with this build's `shardcron` first on the
/// `PATH` and none of the variables an operator's shell may hold.
struct Shell {
    checkout: PathBuf,
    path: String,
    /// What `dev` told to export, if it did.
    exported: Vec<(String, String)>,
    /// The README's ports and pids, and this run's.
    replaced: Vec<(String, String)>,
}

impl Shell {
    fn new() -> Shell {
        let bin_dir = Path::new(SHARDCRON).parent().unwrap().display().to_string();
        Shell {
            checkout: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
            path: format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default()),
            exported: Vec::new(),
            replaced: Vec::new(),
        }
    }

    fn command(&self, line: &str) -> Command {
        let line = self.replaced.iter().fold(line.to_string(), |line, (readme, here)| {
            line.replace(readme.as_str(), here)
        });
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("exec {line}"))
            .current_dir(&self.checkout)
            .env("PATH", &self.path)
            .env("SHARDCRON_ETCD_BIN", etcd_bin())
            .env_remove("SHARDCRON_ENDPOINTS")
            .env_remove("SHARDCRON_CONFIG")
            .env_remove("SHARDCRON_HTTP_ADDR")
            .env_remove("SHARDCRON_NODE_ID")
            .envs(self.exported.iter().map(|(name, value)| (name, value)));
        command
    }

    fn start_dev(&mut self, line: &str) -> Dev {
        if let Some(port) = line
            .split("--http-addr ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
        {
            let readme_port = port.rsplit(':').next().unwrap().to_string();
            let here = shardcron::etcd_server::free_port().unwrap().to_string();
            self.replaced.push((format!(":{readme_port}"), format!(":{here}")));
        }
        let output = tempfile::Builder::new()
            .prefix("shardcron-tour-")
            .tempfile()
            .unwrap()
            .into_temp_path();
        let file = std::fs::File::create(&output).unwrap();
        let child = self
            .command(line)
            .stdin(Stdio::piped())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("start dev");
        Dev { child, output }
    }

    /// Runs a command to its end: its exit status and its stdout and stderr, as one would see
    /// them.
    fn run(&self, line: &str) -> (Option<i32>, Vec<String>) {
        let out = self
            .command(line)
            .stdin(Stdio::null())
            .output()
            .expect("run a tour command");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text.lines().map(String::from).collect())
    }
}

/// Commands that only read, tried again until they print what the README shows (a `status`
/// after a kill shows the shards moved only once the lease is over).
fn only_reads(line: &str) -> bool {
    let verb = line.split_whitespace().nth(1).unwrap_or_default();
    line.starts_with("curl ") || matches!(verb, "status" | "history" | "check" | "plan" | "next")
}

/// `  dev-2  pid 8790  http://...` lines: node id by pid.
fn pids(lines: &[String]) -> BTreeMap<String, String> {
    lines
        .iter()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words[..] {
                [id, "pid", pid, ..] if id.starts_with("dev-") => Some((pid.to_string(), id.to_string())),
                _ => None,
            }
        })
        .collect()
}

/// The node leading the shard of the example's `heartbeat`.
fn heartbeat_leader(shell: &Shell) -> String {
    let (code, printed) = shell.run("shardcron status --json --config config/jobs.toml");
    assert_eq!(code, Some(0), "status --json: {printed:?}");
    let status: serde_json::Value = serde_json::from_str(&printed.join("\n")).expect("status --json");
    let shard = status["jobs"]
        .as_array()
        .and_then(|jobs| jobs.iter().find(|job| job["name"] == "heartbeat"))
        .and_then(|job| job["shard"].as_u64())
        .expect("heartbeat's shard");
    status["shards"]
        .as_array()
        .and_then(|shards| shards.iter().find(|each| each["shard"].as_u64() == Some(shard)))
        .and_then(|each| each["leader"].as_str())
        .expect("heartbeat's shard has a leader")
        .to_string()
}

/// Every `heartbeat tick=... fence=... node=...` line of a `dev` output, as (tick, node, fence).
fn heartbeats(text: &str) -> Vec<(chrono::DateTime<chrono::Utc>, String, i64)> {
    text.lines()
        .filter(|line| line.contains("shardcron::running::runner::output: heartbeat tick="))
        .filter_map(|line| {
            let field = |name: &str| {
                line.rsplit(&format!(" {name}="))
                    .next()
                    .and_then(|rest| rest.split_whitespace().next())
                    .map(String::from)
            };
            let tick = chrono::DateTime::parse_from_rfc3339(&field("tick")?).ok()?;
            Some((
                tick.with_timezone(&chrono::Utc),
                field("node")?,
                field("fence")?.parse().ok()?,
            ))
        })
        .collect()
}

on_both_etcds! {
    fn the_readme_tour_works_as_pasted() {
        let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
        let steps = tour_steps(&readme);
        assert!(steps.len() >= 10, "the tour's steps: {steps:#?}");
        let host = hostname::get().unwrap().to_string_lossy().into_owned();
        let mut shell = Shell::new();
        let mut dev: Option<Dev> = None;
        let mut readme_pids = BTreeMap::new();
        let mut here_pids: BTreeMap<String, String> = BTreeMap::new();
        let mut killed_at = None;
        let mut killed_node: Option<String> = None;
        let mut mismatches = Vec::new();
        for item in &steps {
            let shown = shapes(&item.shown, &host);
            match item.command.as_deref() {
                Some(line) if line.starts_with("shardcron dev") => {
                    step(&format!("$ {line}"));
                    if let Some(running) = dev.take() {
                        running.interrupt();
                    }
                    let started = shell.start_dev(line);
                    // What dev prints comes in over a few seconds: every line the README shows.
                    let _ = wait_within(Duration::from_secs(30), || {
                        shown.is_subset(&shapes(&started.lines(), &host))
                    });
                    let printed = started.lines();
                    if let Some(export) = printed.iter().find_map(|line| line.strip_prefix("export ")) {
                        let (name, value) = export.split_once('=').expect("NAME=value");
                        shell.exported = vec![(name.to_string(), value.to_string())];
                    }
                    let taken = !shell.exported.is_empty();
                    let printed_shapes = shapes(&printed, &host);
                    let missing: Vec<&String> = shown
                        .difference(&printed_shapes)
                        .filter(|shape| !(taken && shape.starts_with("shardcron dev: etcd serves")))
                        .collect();
                    if !missing.is_empty() {
                        mismatches.push(format!(
                            "$ {line}\n  the README shows, dev did not print: {missing:#?}\n  dev printed:\n{}",
                            printed.join("\n")
                        ));
                    }
                    readme_pids = pids(&item.shown);
                    here_pids = pids(&printed).into_iter().map(|(pid, id)| (id, pid)).collect();
                    dev = Some(started);
                }
                Some(line) if line.starts_with("kill ") => {
                    step(&format!("$ {line}"));
                    let running = dev.as_ref().expect("the tour kills a node of its dev");
                    wait_for(Duration::from_secs(30), "a heartbeat before the kill", || {
                        !heartbeats(&running.output()).is_empty()
                    });
                    assert!(
                        line.split_whitespace()
                            .last()
                            .is_some_and(|pid| readme_pids.contains_key(pid)),
                        "the README kills a pid its dev output listed: {line}"
                    );
                    // Not quite the README's node: the one leading heartbeat's shard, so the check
                    // below sees a job of every 5 s taken over, whichever node leads it; and 300 ms
                    // before a tick of it, which its leader may have claimed ahead: that tick falls
                    // due while no node leads, and the new leader must run it.
                    let leader = heartbeat_leader(&shell);
                    let now = chrono::Utc::now();
                    let next_tick = 5_000 - now.timestamp_millis().rem_euclid(5_000);
                    std::thread::sleep(Duration::from_millis((next_tick - 300).rem_euclid(5_000) as u64));
                    let pid = here_pids
                        .get(&leader)
                        .unwrap_or_else(|| panic!("no pid for {leader}: {here_pids:?}"));
                    let (code, printed) = shell.run(&format!("kill -9 {pid}"));
                    assert_eq!(code, Some(0), "{line}: {printed:?}");
                    killed_at = Some(chrono::Utc::now());
                    killed_node = Some(leader.clone());
                    println!("killed {leader} (pid {pid}), heartbeat's leader, at {killed_at:?}");
                }
                Some(line) => {
                    step(&format!("$ {line}"));
                    let deadline = Instant::now() + Duration::from_secs(if only_reads(line) { 30 } else { 0 });
                    let (code, printed) = loop {
                        let (code, printed) = shell.run(line);
                        if code == Some(0) && shapes(&printed, &host) == shown || Instant::now() >= deadline {
                            break (code, printed);
                        }
                        std::thread::sleep(Duration::from_millis(500));
                    };
                    let here = shapes(&printed, &host);
                    if code != Some(0) || here != shown {
                        mismatches.push(format!(
                            "$ {line}\n  exit {code:?}\n  only in the README: {:#?}\n  only printed: {:#?}\n  printed:\n{}",
                            shown.difference(&here).collect::<Vec<_>>(),
                            here.difference(&shown).collect::<Vec<_>>(),
                            printed.join("\n")
                        ));
                    }
                }
                None => {
                    let running = dev.as_ref().expect("a block of dev's output follows a dev");
                    let _ = wait_within(Duration::from_secs(30), || {
                        shown.is_subset(&shapes(&running.lines(), &host))
                    });
                    let printed_shapes = shapes(&running.lines(), &host);
                    let missing: Vec<&String> = shown.difference(&printed_shapes).collect();
                    if !missing.is_empty() {
                        mismatches.push(format!(
                            "dev's output\n  the README shows, dev did not print: {missing:#?}\n  dev printed:\n{}",
                            running.output()
                        ));
                    }
                }
            }
        }
        let killed_at = killed_at.expect("the tour kills a node");
        let mut running = dev.take().expect("the tour ends with dev running");
        let killed = killed_node.expect("the tour kills a node");
        step(&format!("typed into dev: a name off by one, then `start {killed}`"));
        let typed = running.child.stdin.as_mut().expect("dev's stdin");
        writeln!(typed, "start dev-0\nstart {killed}").expect("type into dev");
        wait_for(Duration::from_secs(30), "the killed node started again", || {
            let output = running.output();
            output.contains(&format!("started {killed}, pid"))
                && output.contains(&format!("{killed} | "))
                && output
                    .lines()
                    .any(|line| line.starts_with(&format!("{killed} | ")) && line.contains("session open"))
        });
        assert!(
            running.output().contains("no node \"dev-0\"; did you mean \"dev-1\"?"),
            "a mistyped node is named, with the one meant:\n{}",
            running.output()
        );
        step("every heartbeat tick from the three nodes' start to a tick after the takeover runs once");
        let lease = Duration::from_secs(5);
        // The first tick due after the lease ran out: the new leader's own, after the one that fell
        // due while no node led.
        let after_takeover = killed_at + chrono::Duration::from_std(lease + Duration::from_secs(1)).unwrap();
        wait_for(Duration::from_secs(40), "a heartbeat after the takeover", || {
            heartbeats(&running.output())
                .iter()
                .any(|(tick, _, _)| *tick >= after_takeover)
        });
        let text = running.interrupt();
        assert!(
            mismatches.is_empty(),
            "the README's tour drifted from the program:\n{}",
            mismatches.join("\n\n")
        );
        let ran = heartbeats(&text);
        // heartbeat is at-least-once: a tick the killed node had started but not yet recorded as
        // started runs again, only as the new leader's redelivery (its log says so) with a higher
        // fence. Anything else seen twice, or a tick never run, is a failure.
        let redelivered: BTreeSet<chrono::DateTime<chrono::Utc>> = text
            .lines()
            .filter(|line| line.contains("delivering again ticks") && line.contains("job=heartbeat"))
            .filter_map(|line| {
                line.split(" first=")
                    .nth(1)?
                    .split_whitespace()
                    .next()
                    .map(String::from)
            })
            .filter_map(|tick| chrono::DateTime::parse_from_rfc3339(&tick).ok())
            .map(|tick| tick.with_timezone(&chrono::Utc))
            .collect();
        let mut runs: BTreeMap<chrono::DateTime<chrono::Utc>, Vec<(i64, &str)>> = BTreeMap::new();
        for (tick, node, fence) in &ran {
            runs.entry(*tick).or_default().push((*fence, node));
        }
        let first = *runs.keys().next().expect("heartbeats ran");
        let last = *runs.keys().next_back().unwrap();
        let (mut tick, mut checked, mut again) = (first, 0, 0);
        while tick <= last {
            let each = runs.get(&tick).cloned().unwrap_or_default();
            let once = each.len() == 1;
            let redelivery = each.len() == 2 && redelivered.contains(&tick) && each[0].0 < each[1].0;
            assert!(
                once || redelivery,
                "heartbeat's tick {tick} ran as (fence, node) {each:?}, killed at {killed_at}; redelivered: {redelivered:?}"
            );
            again += usize::from(redelivery);
            checked += 1;
            tick += chrono::Duration::seconds(5);
        }
        println!(
            "heartbeat: {checked} ticks from {first} to {last}, each run once ({again} again as a redelivery with a higher fence), a node killed at {killed_at}"
        );
        assert!(
            first < killed_at && last > killed_at,
            "the window straddles the kill: {first}..{last}, killed at {killed_at}"
        );
    }
}

#[test]
fn the_tour_reader_sees_tables_by_header_and_first_column() {
    let lines: Vec<String> = [
        "NODE  LEADS  ETCD",
        "vm    8      http://127.0.0.1:2379",
        "",
        "JOB        FENCE",
        "heartbeat  22",
        "...",
        "",
        "backfill report-berlin [######] 5/5 done, 0 running",
        "dev-1 | 2026-12-07T18:02:01Z  INFO term{shard=4 term=3}: shardcron::leader: leading shard jobs=1",
    ]
    .iter()
    .map(|line| line.to_string())
    .collect();
    let shapes: Vec<String> = shapes(&lines, "vm").into_iter().collect();
    assert_eq!(
        shapes,
        [
            "INFO shardcron::leader: leading shard",
            "JOB FENCE | heartbeat",
            "NODE LEADS ETCD | vm",
            "backfill report-berlin N/N done, N running",
            "header JOB FENCE",
            "header NODE LEADS ETCD",
        ]
    );
    assert_eq!(
        normalized(
            "cluster demo (8 shards, config digest 8c097ab74ed387ee) on my-host",
            "my-host"
        ),
        "cluster demo (N shards, config digest H) on vm"
    );
    assert_eq!(
        normalized("backfill x: 0/5 done, 0 running", "vm"),
        "backfill x N/N done, N running"
    );
}
