//! A chaos run drawn as an SVG.

use crate::common::*;

/// One chaos run drawn as an SVG: a row per job, a mark per run at its start time coloured by
/// node, the fault moments as vertical lines, and any lost or doubled tick in red.
pub(crate) fn bench_timeline(out: &Path) {
    let ttl = 3;
    let mut world = World::new();
    let names: Vec<String> = (0..8).map(|i| format!("job{i}")).collect();
    let jobs: Vec<(&str, &str, &str)> = names
        .iter()
        .map(|name| (name.as_str(), "* * * * * *", "catch_up = \"all\""))
        .collect();
    let config = world.write_config("jobs.toml", 8, ttl, &jobs);
    for id in ["a", "b", "c"] {
        world.node(id, &config).start();
    }
    wait_for(Duration::from_secs(30), "every job runs", || {
        let runs = world.runs();
        names.iter().all(|name| runs.iter().any(|run| &run.job == name))
    });
    let origin = now_secs().floor() + 1.0;
    let mut events: Vec<(f64, String)> = Vec::new();
    let mut at = |world: &mut World, second: f64, label: &str, act: &dyn Fn(&mut World)| {
        let wait = origin + second - now_secs();
        if wait > 0.0 {
            std::thread::sleep(Duration::from_secs_f64(wait));
        }
        act(world);
        events.push((now_secs() - origin, label.to_string()));
    };
    let index_of = |world: &World, id: &str| world.nodes.iter().rposition(|node| node.id == id).expect("node");
    at(&mut world, 5.5, "SIGKILL a", &|world| {
        let a = index_of(world, "a");
        world.nodes[a].signal(libc::SIGKILL)
    });
    at(&mut world, 14.5, "a restarts", &|world| {
        world.node("a", &config).start();
    });
    at(&mut world, 22.5, "SIGSTOP b", &|world| {
        let b = index_of(world, "b");
        world.nodes[b].signal(libc::SIGSTOP)
    });
    at(&mut world, 22.5 + 2.0 * ttl as f64, "SIGCONT b", &|world| {
        let b = index_of(world, "b");
        world.nodes[b].signal(libc::SIGCONT)
    });
    at(&mut world, 36.5, "SIGTERM c", &|world| {
        let c = index_of(world, "c");
        world.nodes[c].signal(libc::SIGTERM)
    });
    let end = 46.0;
    std::thread::sleep(Duration::from_secs_f64((origin + end - now_secs()).max(0.0) + 1.0));
    let runs = world.runs();
    let svg = render_timeline(&runs, &names, origin, end, &events);
    std::fs::write(out, svg).expect("write the timeline");

    let mut lost = 0;
    let mut doubled = 0;
    for name in &names {
        let mut ticks: Vec<i64> = runs
            .iter()
            .filter(|run| &run.job == name)
            .map(|run| run.tick.timestamp())
            .filter(|tick| (*tick as f64) >= origin && (*tick as f64) < origin + end)
            .collect();
        ticks.sort();
        let before = ticks.len();
        ticks.dedup();
        doubled += before - ticks.len();
        lost += (end as usize).saturating_sub(ticks.len());
    }
    println!("\n### Timeline of a chaos run ({})\n", out.display());
    println!("| jobs | seconds | faults | ticks lost | ticks doubled |");
    println!("|---|---|---|---|---|");
    println!(
        "| {} per-second, catch_up = \"all\", 3 nodes, TTL {ttl} s | {end:.0} | {} | {lost} | {doubled} |",
        names.len(),
        events
            .iter()
            .map(|(_, label)| label.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
}
pub(crate) fn render_timeline(
    runs: &[Run],
    names: &[String],
    origin: f64,
    end: f64,
    events: &[(f64, String)],
) -> String {
    let width = LEFT + end * PER_SECOND + 30.0;
    let height = TOP + ROW * names.len() as f64 + 60.0;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"16\" font-size=\"13\">shardcron chaos run: one mark per run at its start, coloured by node; faded = caught up late; red = lost or doubled tick</text>\n"
    );
    for second in (0..=end as usize).step_by(5) {
        let at = x(second as f64);
        svg.push_str(&format!(
            "<line x1=\"{at:.1}\" y1=\"{TOP}\" x2=\"{at:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/>\n<text x=\"{at:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{second} s</text>\n",
            TOP + ROW * names.len() as f64,
            TOP + ROW * names.len() as f64 + 14.0
        ));
    }
    for (row, name) in names.iter().enumerate() {
        svg.push_str(&job_row(runs, name, TOP + ROW * row as f64 + ROW / 2.0, origin, end));
    }
    for (at, label) in events {
        let at_x = x(*at);
        svg.push_str(&format!(
            "<line x1=\"{at_x:.1}\" y1=\"{:.1}\" x2=\"{at_x:.1}\" y2=\"{:.1}\" stroke=\"black\" stroke-dasharray=\"4 3\"/>\n<text x=\"{:.1}\" y=\"{:.1}\">{label}</text>\n",
            TOP - 8.0,
            TOP + ROW * names.len() as f64,
            at_x + 3.0,
            TOP - 10.0
        ));
    }
    let legend_y = TOP + ROW * names.len() as f64 + 36.0;
    for (index, (id, fill)) in COLOURS.iter().enumerate() {
        let at = LEFT + index as f64 * 90.0;
        svg.push_str(&format!(
            "<rect x=\"{at:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{fill}\"/><text x=\"{:.1}\" y=\"{legend_y:.1}\">node {id}</text>\n",
            legend_y - 9.0,
            at + 14.0
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

const LEFT: f64 = 90.0;
const TOP: f64 = 40.0;
const ROW: f64 = 28.0;
const PER_SECOND: f64 = 18.0;
const COLOURS: [(&str, &str); 3] = [("a", "#1f77b4"), ("b", "#2ca02c"), ("c", "#ff7f0e")];

fn colour(node: &str) -> &'static str {
    COLOURS
        .iter()
        .find(|(id, _)| *id == node)
        .map_or("#7f7f7f", |(_, colour)| colour)
}

/// Where `seconds` after the origin is drawn.
fn x(seconds: f64) -> f64 {
    LEFT + seconds * PER_SECOND
}

/// One job's row at height `y`: its name, a mark per run, and a red cross per tick it missed.
fn job_row(runs: &[Run], name: &str, y: f64, origin: f64, end: f64) -> String {
    let mut svg = String::new();
    let shard = runs.iter().find(|run| run.job == name).map_or(0, |run| run.shard);
    svg.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{name} (shard {shard})</text>\n",
        LEFT - 6.0,
        y + 4.0
    ));
    let mut counts: std::collections::BTreeMap<i64, usize> = std::collections::BTreeMap::new();
    for run in runs.iter().filter(|run| run.job == name) {
        *counts.entry(run.tick.timestamp()).or_default() += 1;
    }
    for run in runs.iter().filter(|run| run.job == name) {
        let at = run.started - origin;
        if !(0.0..end).contains(&at) {
            continue;
        }
        let doubled = counts[&run.tick.timestamp()] > 1;
        svg.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"4\" height=\"{:.1}\" fill=\"{}\"{}><title>{} tick {} fence {} node {} started +{:.3} s</title></rect>\n",
            x(at) - 2.0,
            y - ROW / 3.0,
            ROW * 2.0 / 3.0,
            colour(&run.node),
            match (doubled, run.lateness() > 0.5) {
                (true, _) => " stroke=\"red\" stroke-width=\"2\"",
                (false, true) => " fill-opacity=\"0.45\"",
                (false, false) => "",
            },
            run.job,
            run.tick.to_rfc3339(),
            run.fence,
            run.node,
            run.lateness()
        ));
    }
    for second in 0..end as i64 {
        let tick = origin as i64 + second;
        if !counts.contains_key(&tick) {
            svg.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"red\" text-anchor=\"middle\" font-weight=\"bold\">×</text>\n",
                x(second as f64),
                y + 4.0
            ));
        }
    }

    svg
}
