//! Idle and slow-header HTTP clients beside per-second jobs.

use crate::common::*;

/// Whether the node has closed `stream` (a read sees its end) without waiting.
pub(crate) fn closed_by_node(stream: &std::net::TcpStream) -> bool {
    use std::io::Read;
    let _ = stream.set_nonblocking(true);
    let mut byte = [0u8; 64];
    matches!((&*stream).read(&mut byte), Ok(0))
        || matches!((&*stream).read(&mut byte), Err(ref err) if err.kind() == std::io::ErrorKind::ConnectionReset)
}
/// `connections` clients that hold a connection and send nothing (half of them) or trickle a
/// request head a byte a second (the other half), reconnecting whenever the node closes one,
/// for `seconds`, beside 20 per-second jobs: ticks run and missed, and `/healthz` answer times.
pub(crate) fn bench_clients(connections: usize, seconds: u64) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let mut world = World::new();
    let names = job_names(20, 2);
    let config = world.write_config("jobs.toml", 4, 2, &every_second(&names, ""));
    let port = world.node("a", &config).start_serving();
    wait_for(Duration::from_secs(30), "every job runs", || {
        every_job_ran_since(&world.runs(), &names, now_secs() - 3.0, 1)
    });
    let pid = world.nodes[0].child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let threads = 10;
    let flood: Vec<_> = (0..threads)
        .map(|thread| {
            let (stop, opened) = (Arc::clone(&stop), Arc::clone(&opened));
            let slow = thread % 2 == 1;
            std::thread::spawn(move || hold_connections(port, connections / threads, slow, &stop, &opened))
        })
        .collect();
    let from = now_secs();
    let mut answered = Vec::new();
    let mut failed = 0;
    let mut most_descriptors = 0;
    let until = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < until {
        let asked = Instant::now();
        match http_exchange(
            port,
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            Duration::from_secs(15),
        ) {
            Some(response) if response.status == 200 => answered.push(asked.elapsed().as_secs_f64()),
            _ => failed += 1,
        }
        most_descriptors =
            most_descriptors.max(std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |entries| entries.count()));
        std::thread::sleep(Duration::from_millis(100));
    }
    let to = now_secs();
    stop.store(true, Ordering::Relaxed);
    for thread in flood {
        let _ = thread.join();
    }
    wait_for(Duration::from_secs(20), "the window's last ticks ran", || {
        every_job_ran_a_tick_after(&world.runs(), &names, to)
    });
    let runs = world.runs();
    let (first, last) = (from.ceil() as i64, to.floor() as i64);
    let (missed, doubled) = missed_and_doubled(&runs, &names, first, last);
    answered.sort_by(f64::total_cmp);
    println!("\n### {connections} idle and slow-header clients for {seconds} s beside 20 per-second jobs\n");
    println!("Half the clients send nothing, half a request head a byte a second; each reconnects when the node closes it.\n");
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!(
        "| ticks in the window: run / missed / run twice | {} / {missed} / {doubled} | every one once |",
        (last - first) as usize * names.len() - missed
    );
    println!(
        "| connections the clients opened (with reconnects) | {} | |",
        opened.load(Ordering::Relaxed)
    );
    println!("| descriptors the node held, most seen | {most_descriptors} | |");
    println!(
        "| `/healthz` probes answered / failed | {} / {failed} | |",
        answered.len()
    );
    println!(
        "| `/healthz` answer time p50 / p99 / max | {} / {} / {} | |",
        ms(percentile(&answered, 50.0)),
        ms(percentile(&answered, 99.0)),
        ms(percentile(&answered, 100.0))
    );
}

/// One client thread's share: holds `connections` to the node on `port`, reconnecting whenever
/// the node closes one, and if `slow` trickles a request head a byte a second; until `stop`.
fn hold_connections(
    port: u16,
    connections: usize,
    slow: bool,
    stop: &std::sync::atomic::AtomicBool,
    opened: &std::sync::atomic::AtomicUsize,
) {
    use std::io::Write;
    use std::sync::atomic::Ordering;

    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut held: Vec<std::net::TcpStream> = Vec::new();
    let mut last_byte = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        held.retain(|stream| !closed_by_node(stream));
        while held.len() < connections {
            match std::net::TcpStream::connect_timeout(&address, Duration::from_millis(200)) {
                Ok(mut stream) => {
                    if slow {
                        let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\n");
                    }
                    opened.fetch_add(1, Ordering::Relaxed);
                    held.push(stream);
                }
                Err(_) => break,
            }
        }
        if slow && last_byte.elapsed() >= Duration::from_secs(1) {
            for stream in &mut held {
                let _ = stream.write_all(b"X");
            }
            last_byte = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Of each job's ticks from `first` up to `last` (seconds): how many never ran, and how many
/// runs came after a tick's first.
fn missed_and_doubled(runs: &[Run], names: &[String], first: i64, last: i64) -> (usize, usize) {
    let (mut missed, mut doubled) = (0, 0);
    for name in names {
        for tick in first..last {
            let count = runs
                .iter()
                .filter(|run| &run.job == name && run.tick.timestamp() == tick)
                .count();
            missed += usize::from(count == 0);
            doubled += count.saturating_sub(1);
        }
    }
    (missed, doubled)
}
