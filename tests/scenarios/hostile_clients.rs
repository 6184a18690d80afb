//! The HTTP listener against clients that do not play fair: bad input, other sites' pages, idle
//! and slow connections, and more of them than the node has descriptors.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

const TOKEN_VAR: &str = "SHARDCRON_TEST_API_TOKEN";
const TOKEN: &str = "correct horse battery staple";

fn with_token(port: u16, method: &str, path: &str, body: &str) -> HttpResponse {
    http_request(
        port,
        method,
        path,
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        body,
    )
}

/// The answer is `status` with a JSON `{"error": ...}` body.
fn assert_json_error(response: &HttpResponse, status: u16, what: &str) {
    assert_eq!(
        response.status, status,
        "{what}: {} {}",
        response.status_line, response.body
    );
    assert_eq!(
        response.header("content-type"),
        Some("application/json"),
        "{what}: {}",
        response.body
    );
    assert!(
        response.json()["error"].as_str().is_some_and(|error| !error.is_empty()),
        "{what}: {}",
        response.body
    );
}

#[test]
fn hostile_requests_get_clear_json_errors_and_change_nothing() {
    let mut world = World::new();
    let config = world.write_config("jobs.toml", 2, 2, &[("daily", "0 3 * * *", "")]);
    let port = shardcron::etcd_server::free_port().expect("port");
    world
        .node("a", &config)
        .args(&[
            "--http-addr",
            &port.to_string(),
            "--api-token-env",
            TOKEN_VAR,
            "--http-allowed-hosts",
            "cron.example.com,other.example:8443",
        ])
        .env(&[(TOKEN_VAR, TOKEN)])
        .start();
    wait_ready(port);

    step("bad queries, methods and bodies are 400/405/413 with a JSON error");
    let zero = http_request(port, "GET", "/api/v1/jobs/daily/history?count=0", &[], "");
    assert_json_error(&zero, 400, "count=0");
    let banana = http_request(port, "GET", "/api/v1/jobs/daily/history?count=banana", &[], "");
    assert_json_error(&banana, 400, "a count that is no number");
    let negative = http_request(port, "GET", "/api/v1/plan?limit=-1", &[], "");
    assert_json_error(&negative, 400, "a negative plan limit");
    let method = http_request(port, "DELETE", "/api/v1/status", &[], "");
    assert_json_error(&method, 405, "a wrong method");
    let missing = http_request(port, "GET", "/nothing-here", &[], "");
    assert_json_error(&missing, 404, "an unknown path");
    let bad_json = with_token(port, "POST", "/api/v1/jobs/daily/pause", "{not json");
    assert_json_error(&bad_json, 400, "a body that is no JSON");
    let huge = with_token(port, "POST", "/api/v1/jobs/daily/pause", &" ".repeat(100_000));
    assert_json_error(&huge, 413, "a body past the limit");

    step("a write's body is not read before its token passed");
    let started = Instant::now();
    let unread = http_exchange(
        port,
        b"POST /api/v1/jobs/daily/trigger HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2000000\r\n\r\n",
        Duration::from_secs(5),
    )
    .expect("an answer before the body was sent");
    assert_json_error(&unread, 401, "a write without a token");
    assert!(started.elapsed() < Duration::from_secs(5));

    step("a pause reason is at most 1 KiB");
    let long = format!("{{\"for\": \"1h\", \"reason\": \"{}\"}}", "r".repeat(1025));
    assert_json_error(
        &with_token(port, "POST", "/api/v1/jobs/daily/pause", &long),
        400,
        "a reason of 1025 bytes",
    );
    let fits = format!("{{\"for\": \"1h\", \"reason\": \"{}\"}}", "r".repeat(1024));
    let paused = with_token(port, "POST", "/api/v1/jobs/daily/pause", &fits);
    assert_eq!(paused.status, 200, "{}", paused.body);
    assert_eq!(
        with_token(port, "POST", "/api/v1/jobs/daily/resume", "").json()["resumed"],
        true
    );

    step("durations past their bounds are refused before anything is written");
    let (_, plan) = http_get(port, "/api/v1/plan?for=300000000000y");
    assert!(plan.contains("longer than the longest allowed, 100years"), "{plan}");
    let trigger = with_token(
        port,
        "POST",
        "/api/v1/jobs/daily/trigger",
        r#"{"timeout": "300000000000y"}"#,
    );
    assert_json_error(&trigger, 400, "a trigger timeout of 300000000000y");
    assert!(trigger.body.contains("1day"), "{}", trigger.body);
    assert_json_error(
        &with_token(port, "POST", "/api/v1/jobs/daily/pause", r#"{"for": "265000y"}"#),
        400,
        "a pause for 265000y",
    );

    step("a backfill from before 1970, or at the limit of time, is 400, not a dead connection");
    for from in ["-262143-01-01T00:00:00Z", "1969-12-31T23:59:59Z"] {
        let body = format!(r#"{{"from": "{from}", "to": "2025-01-01T00:00:00Z", "dry_run": true}}"#);
        assert_json_error(
            &with_token(port, "POST", "/api/v1/jobs/daily/backfill", &body),
            400,
            &format!("a backfill from {from}"),
        );
    }

    step("the job path * is no job for any verb, and leaves pause --all alone");
    let paused_all = Command::new(SHARDCRON)
        .args(["pause", "--all", "--config"])
        .arg(&config)
        .output()
        .expect("run pause --all");
    assert!(
        paused_all.status.success(),
        "{}",
        String::from_utf8_lossy(&paused_all.stderr)
    );
    for (method, path) in [
        ("POST", "/api/v1/jobs/*/resume"),
        ("POST", "/api/v1/jobs/%2A/resume"),
        ("POST", "/api/v1/jobs/*/pause"),
        ("POST", "/api/v1/jobs/*/trigger"),
        ("GET", "/api/v1/jobs/*/history"),
    ] {
        assert_json_error(&with_token(port, method, path, ""), 404, path);
    }
    let status = world.status(&config);
    assert!(
        status.jobs[0].paused.is_some(),
        "pause --all still holds after POST /api/v1/jobs/*/resume"
    );

    step("pages carry the security headers");
    for path in ["/", "/dashboard.js", "/api/v1/status", "/nothing-here"] {
        let response = http_request(port, "GET", path, &[], "");
        let policy = response.header("content-security-policy").unwrap_or_default();
        assert!(
            policy.contains("default-src 'none'") && policy.contains("frame-ancestors 'none'"),
            "{path}: {policy:?}"
        );
        assert_eq!(response.header("x-frame-options"), Some("DENY"), "{path}");
        assert_eq!(response.header("x-content-type-options"), Some("nosniff"), "{path}");
    }

    step("a Host that is not this listener's is 421: DNS rebinding reads nothing");
    let with_host = |host: &str| http_request(port, "GET", "/api/v1/status", &[("Host", host)], "").status;
    for host in [
        "attacker.example",
        &format!("attacker.example:{port}"),
        "localhost.attacker.example",
        "other.example",
    ] {
        assert_eq!(with_host(host), 421, "Host: {host}");
    }
    assert_json_error(
        &http_request(port, "GET", "/api/v1/status", &[("Host", "attacker.example")], ""),
        421,
        "a foreign Host",
    );
    for host in [
        "localhost",
        &format!("localhost:{port}"),
        &format!("127.0.0.1:{port}"),
        "[::1]",
        "cron.example.com",
        "CRON.example.com:1234",
        "other.example:8443",
    ] {
        assert_eq!(with_host(host), 200, "Host: {host}");
    }
}

/// Opens a connection that sends nothing, or only the start of a request head.
fn open_idle(port: u16, first_bytes: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    if !first_bytes.is_empty() {
        stream.write_all(first_bytes).expect("send");
    }
    stream
}

/// Whether the server closed `stream` (a read sees the end) within `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).expect("timeout");
    let mut buffer = [0u8; 1024];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            // A 408 or similar before the close is fine.
            Ok(_) => continue,
            Err(err) if err.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// The node's open descriptors.
fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |entries| entries.count())
}

#[test]
fn idle_and_slow_clients_are_closed_and_capped() {
    let mut world = World::new();
    let config = world.write_config("jobs.toml", 2, 2, &[("daily", "0 3 * * *", "")]);
    let port = shardcron::etcd_server::free_port().expect("port");
    let node = world
        .node("a", &config)
        .args(&["--http-addr", &port.to_string(), "--http-max-connections", "8"])
        .start();
    wait_ready(port);
    let pid = world.nodes[node].child.id();

    step("a connection that sends no request, and one that trickles its head, are closed");
    let mut silent = open_idle(port, b"");
    let mut trickling = open_idle(port, b"GET /healthz HTTP/1.1\r\n");
    let started = Instant::now();
    let trickler = std::thread::spawn(move || {
        // A header byte a second: each one would reset a plain read timeout.
        for _ in 0..40 {
            std::thread::sleep(Duration::from_secs(1));
            if trickling.write_all(b"X").is_err() {
                return (trickling, true);
            }
        }
        (trickling, false)
    });
    assert!(
        closed_within(&mut silent, Duration::from_secs(30)),
        "a silent client is closed"
    );
    let (mut trickling, cut) = trickler.join().expect("trickler");
    assert!(
        cut || closed_within(&mut trickling, Duration::from_secs(1)),
        "a client that trickles its request head is closed"
    );
    eprintln!("closed after {:?}", started.elapsed());

    step("past the cap, connections wait in the backlog and hold none of the node's descriptors");
    let before = descriptors(pid);
    let held: Vec<TcpStream> = (0..60).map(|_| open_idle(port, b"")).collect();
    // Each accepted connection holds one descriptor; the rest wait in the kernel's queue.
    let mut most = 0;
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        most = most.max(descriptors(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        most <= before + 8 + 4,
        "60 idle clients took {} descriptors past the {before} before (cap 8)",
        most - before
    );
    step("and a probe is still answered: at the cap, idle connections go first");
    let probe = http_exchange(
        port,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        Duration::from_secs(30),
    )
    .expect("/healthz answers beside 60 idle clients");
    assert_eq!(probe.status, 200);
    drop(held);
}

/// A tight descriptor limit (hard, so the node cannot raise it), 20 per-second jobs, and a
/// flood of idle clients that reconnect whenever the node closes them: every tick still runs.
#[test]
fn hundreds_of_idle_clients_do_not_starve_the_runs_of_descriptors() {
    let mut world = World::new();
    let names = job_names(20, 2);
    let config = world.write_config("jobs.toml", 2, 2, &every_second(&names, ""));
    let port = shardcron::etcd_server::free_port().expect("port");
    world
        .node("a", &config)
        .args(&["--http-addr", &port.to_string()])
        .descriptor_limit(200)
        .start();
    wait_ready(port);
    wait_for(Duration::from_secs(30), "every job runs", || {
        every_job_ran_since(&world.runs(), &names, now_secs() - 5.0, 1)
    });

    step("300 idle clients, reconnecting when closed");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood: Vec<_> = (0..6)
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut held: Vec<TcpStream> = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // Drop the ones the node closed, and open new ones up to 50 a thread.
                    held.retain(|stream| {
                        let _ = stream.set_nonblocking(true);
                        let mut byte = [0u8; 1];
                        !matches!((&*stream).read(&mut byte), Ok(0))
                    });
                    while held.len() < 50 {
                        match TcpStream::connect_timeout(
                            &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
                            Duration::from_millis(200),
                        ) {
                            Ok(stream) => held.push(stream),
                            Err(_) => break,
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    let flood_from = now_secs();
    let mut probes = 0;
    let mut answered = 0;
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        probes += 1;
        if http_exchange(
            port,
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            Duration::from_secs(5),
        )
        .is_some_and(|response| response.status == 200)
        {
            answered += 1;
        }
    }
    let flood_to = now_secs();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for thread in flood {
        thread.join().expect("flood thread");
    }
    eprintln!("/healthz answered {answered} of {probes} probes under the flood");
    assert!(answered > 0, "/healthz answers under the flood");

    step("every tick of the flood's window ran, once");
    wait_for(Duration::from_secs(20), "the window's last ticks ran", || {
        every_job_ran_a_tick_after(&world.runs(), &names, flood_to)
    });
    let runs = world.runs();
    for name in &names {
        let ticks = assert_each_tick_once(&runs, name, 1);
        let in_window = ticks
            .iter()
            .filter(|tick| {
                let at = tick.timestamp() as f64;
                at >= flood_from.ceil() && at < flood_to.floor()
            })
            .count();
        let expected = (flood_to.floor() - flood_from.ceil()) as usize;
        assert_eq!(in_window, expected, "{name} ran every tick of the flood's window");
    }
    let log = world.nodes[0].log_text();
    assert!(!log.contains("Too many open files"), "a spawn ran out of descriptors");
}

/// Runs that hold descriptors (their output pipes) until the limit is reached: the spawns that
/// fail are counted and `/readyz` says why.
#[test]
fn a_spawn_out_of_descriptors_is_counted_and_shown_on_readyz() {
    let mut world = World::new();
    // A run a second, each holding its output pipes in the node for 40 s: about 40 runs at
    // once, more than 64 descriptors hold.
    let config = world.write_config_running(
        "jobs.toml",
        1,
        2,
        &[("hog", EVERY_SECOND, "overlap = \"allow\"")],
        "sleep 40",
    );
    let port = shardcron::etcd_server::free_port().expect("port");
    world
        .node("a", &config)
        .args(&["--http-addr", &port.to_string()])
        .descriptor_limit(64)
        .start();
    wait_for(
        Duration::from_secs(60),
        "a spawn failed for want of descriptors",
        || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
                && sample(
                    &http_get(port, "/metrics").1,
                    "shardcron_spawn_descriptor_exhausted_total",
                )
                .is_some_and(|count| count > 0.0)
        },
    );
    let (status, reason) = http_get(port, "/readyz");
    assert!(status.contains(" 503 "), "{status} {reason}");
    assert!(reason.contains("file descriptors"), "{reason}");
}

/// `GET path` on a fresh connection, answered within `limit` (connect included), else `None`.
fn probe_within(port: u16, path: &str, limit: Duration) -> Option<u16> {
    let started = Instant::now();
    let mut stream = TcpStream::connect_timeout(&std::net::SocketAddr::from(([127, 0, 0, 1], port)), limit).ok()?;
    stream.set_read_timeout(Some(limit)).ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes())
        .ok()?;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.windows(2).any(|window| window == b"\r\n") {
        let read = stream.read(&mut buffer).ok()?;
        if read == 0 || started.elapsed() > limit {
            return None;
        }
        answer.extend_from_slice(&buffer[..read]);
    }
    String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
}

/// A client that is always in a request: it keeps `depth` requests pipelined ahead of the
/// answers it reads, so the node never sees it between two requests.
fn busy_client(port: u16, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let paths = ["/api/v1/activity", "/api/v1/plan?for=1h"];
        let mut answered = 0;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let batch: String = (0..4)
                .map(|index| format!("GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", paths[index % 2]))
                .collect();
            if stream.write_all(batch.as_bytes()).is_err() {
                continue;
            }
            let mut buffer = [0u8; 64 * 1024];
            let mut seen = 0usize;
            let mut asked = 4usize;
            // Ask for more before the last answers are read: always a request waiting.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if asked - seen < 4 {
                    if stream.write_all(batch.as_bytes()).is_err() {
                        break;
                    }
                    asked += 4;
                }
                match stream.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(read) => {
                        let text = String::from_utf8_lossy(&buffer[..read]);
                        seen += text.matches("HTTP/1.1 ").count();
                        answered += text.matches("HTTP/1.1 ").count();
                    }
                    Err(err)
                        if matches!(
                            err.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => break,
                }
            }
        }
        answered
    })
}

/// As many keep-alive clients as the node has connection slots, each always in a request:
/// `/healthz` and `/readyz` still answer in time.
#[test]
fn busy_clients_on_every_slot_do_not_starve_the_probes() {
    let mut world = World::new();
    let config = world.write_config("jobs.toml", 2, 2, &[("daily", "0 3 * * *", "")]);
    let port = shardcron::etcd_server::free_port().expect("port");
    world
        .node("a", &config)
        .args(&["--http-addr", &port.to_string()])
        .start();
    wait_ready(port);

    step("256 busy keep-alive clients, each always with requests in flight");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..256)
        .map(|_| busy_client(port, std::sync::Arc::clone(&stop)))
        .collect();
    // Until every slot is held, and then some.
    std::thread::sleep(Duration::from_secs(3));

    step("the probes answer within 5 s each, for 15 s");
    let until = Instant::now() + Duration::from_secs(15);
    let mut probes = 0;
    let mut failed = Vec::new();
    while Instant::now() < until {
        for path in ["/healthz", "/readyz"] {
            probes += 1;
            let asked = Instant::now();
            match probe_within(port, path, Duration::from_secs(5)) {
                Some(200) => {}
                other => failed.push(format!("{path}: {other:?} after {:?}", asked.elapsed())),
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered: usize = clients.into_iter().map(|client| client.join().expect("client")).sum();
    eprintln!("{probes} probes, the busy clients had {answered} answers");
    assert!(answered > 0, "the busy clients were served");
    assert!(
        failed.is_empty(),
        "{} of {probes} probes failed: {failed:?}",
        failed.len()
    );
}
