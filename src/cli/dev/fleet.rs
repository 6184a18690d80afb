//! `dev --nodes N`: N nodes as child processes, on one throwaway etcd, so a failover can be
//! watched on one machine. Each child is a plain `shardcron run` with its own node id and HTTP
//! port; its log lines come out prefixed by its id. Each is in a process group of its own, so a
//! Ctrl-C reaches `dev` alone, which stops the nodes as `run` stops on a signal: the first lets
//! running commands end within the grace, a second stops them now. A `dev` killed outright takes
//! its nodes with it (their parent-death signal).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use rustix::process::{Pid, Signal};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::cli::NodeArgs;

/// The first HTTP port when `--http-addr` names none.
const DEFAULT_HTTP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 8080);

/// How often exits are looked for.
const REAP_EVERY: Duration = Duration::from_millis(200);

/// After the second signal, how long the nodes have to end before they are killed: a node
/// exits by itself within 3 s of it.
const HURRY_LIMIT: Duration = Duration::from_secs(5);

/// What `dev` starts.
pub struct Plan {
    pub config: PathBuf,
    pub node: NodeArgs,
    pub endpoint: String,
    pub count: u8,
}

struct DevNode {
    id: String,
    http: SocketAddr,
    child: Option<Child>,
    /// The running child's, kept: a reaped child no longer tells it.
    pid: u32,
}

/// Starts the nodes, follows the commands typed on stdin, and stops every node on the first
/// SIGINT or SIGTERM.
pub async fn run(plan: Plan) -> Result<()> {
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        anyhow::bail!("cannot install signal handlers");
    };
    let exe = std::env::current_exe().context("cannot find this program's path to start the nodes")?;
    let prefix = plan.node.node_id.clone().unwrap_or_else(|| "dev".into());
    let first = plan.node.http_addr.unwrap_or(SocketAddr::V4(DEFAULT_HTTP));
    let mut nodes: Vec<DevNode> = (0..plan.count)
        .map(|index| DevNode {
            id: format!("{prefix}-{}", index + 1),
            http: http_address(first, index),
            child: None,
            pid: 0,
        })
        .collect();
    for node in &mut nodes {
        start(&exe, &plan, node)?;
    }
    eprintln!("shardcron dev: {} nodes on one etcd ({}):", nodes.len(), plan.endpoint);
    for node in &nodes {
        eprintln!(
            "  {}  pid {}  http://{}/",
            node.id,
            pid_of(node).unwrap_or(0),
            node.http
        );
    }
    let victim = &nodes[nodes.len() / 2];
    eprintln!(
        "To see a failover: kill -9 {} (or type `kill {}` here), then `shardcron status`: its shards move to the others and each tick runs once. Type `start {}` to bring it back; `stop NODE` stops one gracefully. Ctrl-C stops them all.",
        pid_of(victim).unwrap_or(0),
        victim.id,
        victim.id
    );
    let typed = read_stdin_lines();
    let mut typed = Some(typed);
    let mut reap = tokio::time::interval(REAP_EVERY);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            line = next_line(&mut typed) => match line {
                Some(line) => obey(&line, &exe, &plan, &mut nodes),
                None => typed = None,
            },
            _ = reap.tick() => reap_exits(&mut nodes, Phase::Running),
        }
    }
    let grace = humantime::format_duration(plan.node.shutdown_grace);
    eprintln!(
        "shardcron dev: stopping {} nodes; each lets its running commands end within {grace}. Ctrl-C again stops them now.",
        running(&nodes)
    );
    signal_all(&nodes, Signal::TERM);
    let mut hurried_at = None;
    while running(&nodes) > 0 {
        tokio::select! {
            _ = term.recv(), if hurried_at.is_none() => hurried_at = Some(hurry(&nodes)),
            _ = int.recv(), if hurried_at.is_none() => hurried_at = Some(hurry(&nodes)),
            _ = reap.tick() => reap_exits(&mut nodes, Phase::Stopping),
        }
        if hurried_at.is_some_and(|at: tokio::time::Instant| at.elapsed() > HURRY_LIMIT) {
            eprintln!("shardcron dev: nodes still running {HURRY_LIMIT:?} after the second Ctrl-C: SIGKILL");
            signal_all(&nodes, Signal::KILL);
            hurried_at = None;
        }
    }
    Ok(())
}

/// Port `first + index` when it is free, else any free port: a node must not fail to start
/// because something else serves 8081.
fn http_address(first: SocketAddr, index: u8) -> SocketAddr {
    let wanted = SocketAddr::new(first.ip(), first.port().saturating_add(u16::from(index)));
    if TcpListener::bind(wanted).is_ok() {
        return wanted;
    }
    TcpListener::bind(SocketAddr::new(first.ip(), 0))
        .and_then(|listener| listener.local_addr())
        .unwrap_or(wanted)
}

fn start(exe: &std::path::Path, plan: &Plan, node: &mut DevNode) -> Result<()> {
    let args = &plan.node;
    let mut command = Command::new(exe);
    command
        .arg("run")
        .arg("--config")
        .arg(&plan.config)
        .args(["--endpoints", &plan.endpoint, "--node-id", &node.id])
        .args(["--http-addr", &node.http.to_string()])
        .arg("--shutdown-grace")
        .arg(humantime::format_duration(args.shutdown_grace).to_string())
        .arg("--log-format")
        .arg(match args.log_format {
            crate::cli::LogFormat::Text => "text",
            crate::cli::LogFormat::Json => "json",
        });
    if !args.tags.is_empty() {
        command
            .arg("--tags")
            .arg(args.tags.iter().collect::<Vec<_>>().join(","));
    }
    let tokens = [
        ("--api-token-env", args.api_token_env.as_ref().map(PathBuf::from)),
        ("--api-token-file", args.api_token_file.clone()),
        (
            "--api-read-token-env",
            args.api_read_token_env.as_ref().map(PathBuf::from),
        ),
        ("--api-read-token-file", args.api_read_token_file.clone()),
    ];
    for (flag, value) in tokens {
        if let Some(value) = value {
            command.arg(flag).arg(value);
        }
    }
    // SAFETY: the closure runs in the child between fork and exec and makes one system call
    // (prctl), which is async-signal-safe; it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(|| {
            // A `dev` that dies without stopping its nodes (SIGKILL) still stops them: each gets
            // the SIGTERM of a graceful stop. It is tied to this thread, the runtime's main one,
            // which lives as long as `dev`.
            rustix::process::set_parent_process_death_signal(Some(Signal::TERM)).map_err(std::io::Error::from)
        });
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start node {}", node.id))?;
    if let Some(stdout) = child.stdout.take() {
        tokio::spawn(prefix_lines(node.id.clone(), stdout));
    }
    if let Some(stderr) = child.stderr.take() {
        tokio::spawn(prefix_lines(node.id.clone(), stderr));
    }
    node.pid = child.id().unwrap_or(0);
    node.child = Some(child);
    Ok(())
}

/// Copies a node's output to this terminal, each line after the node's id.
async fn prefix_lines(id: String, stream: impl AsyncRead + Unpin) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        eprintln!("{id} | {line}");
    }
}

/// Lines typed on stdin, read on a thread of their own: a read blocked on a terminal must not
/// hold up the runtime's shutdown.
fn read_stdin_lines() -> mpsc::Receiver<String> {
    let (lines, typed) = mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if lines.blocking_send(line).is_err() {
                break;
            }
        }
    });
    typed
}

async fn next_line(typed: &mut Option<mpsc::Receiver<String>>) -> Option<String> {
    match typed {
        Some(typed) => typed.recv().await,
        None => std::future::pending().await,
    }
}

/// One typed command: `stop NODE`, `kill NODE` or `start NODE`.
fn obey(line: &str, exe: &std::path::Path, plan: &Plan, nodes: &mut [DevNode]) {
    let mut words = line.split_whitespace();
    let (Some(verb), Some(id), None) = (words.next(), words.next(), words.next()) else {
        if !line.trim().is_empty() {
            eprintln!("shardcron dev: type `stop NODE`, `kill NODE` or `start NODE`");
        }
        return;
    };
    let Some(index) = nodes.iter().position(|node| node.id == id) else {
        let ids = nodes.iter().map(|node| node.id.as_str());
        let suggestion = crate::rules::suggest::did_you_mean(id, ids.clone());
        eprintln!(
            "shardcron dev: no node {id:?}{suggestion} (nodes: {})",
            ids.collect::<Vec<_>>().join(", ")
        );
        return;
    };
    let node = &mut nodes[index];
    match (verb, pid_of(node)) {
        ("stop", Some(pid)) => {
            eprintln!("shardcron dev: SIGTERM to {id} (pid {pid}): it resigns its shards and lets its commands end");
            signal_pid(pid, Signal::TERM);
        }
        ("kill", Some(pid)) => {
            eprintln!("shardcron dev: SIGKILL to {id} (pid {pid}): its shards move once its lease expires");
            signal_pid(pid, Signal::KILL);
        }
        ("start", None) => match start(exe, plan, node) {
            Ok(()) => eprintln!("shardcron dev: started {id}, pid {}", pid_of(node).unwrap_or(0)),
            Err(err) => eprintln!("shardcron dev: {err:#}"),
        },
        ("start", Some(pid)) => eprintln!("shardcron dev: {id} runs already (pid {pid})"),
        ("stop" | "kill", None) => eprintln!("shardcron dev: {id} is not running; `start {id}` starts it"),
        _ => eprintln!("shardcron dev: type `stop NODE`, `kill NODE` or `start NODE`"),
    }
}

#[derive(PartialEq)]
enum Phase {
    Running,
    Stopping,
}

/// Says which nodes exited, and forgets them.
fn reap_exits(nodes: &mut [DevNode], phase: Phase) {
    for node in nodes {
        let Some(child) = node.child.as_mut() else { continue };
        let Ok(Some(status)) = child.try_wait() else { continue };
        node.child = None;
        let again = match phase {
            Phase::Running => format!("; `start {}` starts it again", node.id),
            Phase::Stopping => String::new(),
        };
        eprintln!(
            "shardcron dev: {} (pid {}) {}{again}",
            node.id,
            node.pid,
            described(status)
        );
    }
}

fn described(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => "exited".into(),
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(9)) => "was killed (SIGKILL)".into(),
        (None, Some(signal)) => format!("was ended by signal {signal}"),
        (None, None) => "ended".into(),
    }
}

fn pid_of(node: &DevNode) -> Option<u32> {
    node.child.as_ref().map(|_| node.pid)
}

fn running(nodes: &[DevNode]) -> usize {
    nodes.iter().filter(|node| node.child.is_some()).count()
}

fn signal_all(nodes: &[DevNode], signal: Signal) {
    for pid in nodes.iter().filter_map(pid_of) {
        signal_pid(pid, signal);
    }
}

/// The second signal, passed on: a node that gets one stops its running commands now.
fn hurry(nodes: &[DevNode]) -> tokio::time::Instant {
    eprintln!("shardcron dev: second signal: the nodes stop their running commands now");
    signal_all(nodes, Signal::TERM);
    tokio::time::Instant::now()
}

fn signal_pid(pid: u32, signal: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}
