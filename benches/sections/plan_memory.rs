//! Concurrent long plans: the node's memory growth.

use crate::common::*;

/// `concurrent` requests of `GET /api/v1/plan?for=100y` at once on a node of 20 per-second jobs
/// (each answer is cut at 10,000 fires): how much the node's resident memory grows.
pub(crate) fn bench_plan_memory(concurrent: usize) {
    let mut world = World::new();
    let names = job_names(20, 2);
    let config = world.write_config("jobs.toml", 4, 2, &every_second(&names, ""));
    let port = world.node("a", &config).start_serving();
    // One plan first, so what the first request allocates for good is in the baseline.
    let warm = http_request(port, "GET", "/api/v1/plan?for=100y", &[], "");
    let answer_mib = warm.body.len() as f64 / (1024.0 * 1024.0);
    std::thread::sleep(Duration::from_secs(2));
    let before = world.nodes[0].rss_mib();
    let started = Instant::now();
    let requests: Vec<_> = (0..concurrent)
        .map(|_| {
            std::thread::spawn(move || {
                let asked = Instant::now();
                let response = http_exchange(
                    port,
                    b"GET /api/v1/plan?for=100y HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                    Duration::from_secs(120),
                );
                (
                    response.map_or(0, |response| response.status),
                    asked.elapsed().as_secs_f64(),
                )
            })
        })
        .collect();
    let mut most = before;
    while requests.iter().any(|request| !request.is_finished()) {
        most = most.max(world.nodes[0].rss_mib());
        std::thread::sleep(Duration::from_millis(10));
    }
    let results: Vec<(u16, f64)> = requests.into_iter().filter_map(|request| request.join().ok()).collect();
    let all_in = started.elapsed().as_secs_f64();
    let ok = results.iter().filter(|(status, _)| *status == 200).count();
    let mut times: Vec<f64> = results.iter().map(|(_, time)| *time).collect();
    times.sort_by(f64::total_cmp);
    println!("\n### {concurrent} concurrent `GET /api/v1/plan?for=100y` (10,000 fires, {answer_mib:.1} MiB each)\n");
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!("| answered 200 | {ok} of {concurrent} | |");
    println!(
        "| answer time p50 / max; all answered in | {} / {} ; {all_in:.2} s | |",
        ms(percentile(&times, 50.0)),
        ms(percentile(&times, 100.0))
    );
    println!("| node resident memory before | {before:.1} MiB | |");
    println!(
        "| growth, most seen while they ran | {:.1} MiB | ≤ 100 MB |",
        most - before
    );
}
