//! The fenced-SQLite downstream of the split-brain and packet-drop scenarios: jobs that write
//! through `examples/fenced-sqlite/report.sh`, and the store read back.

use std::path::Path;
use std::process::Command;

use super::World;

/// The fenced-SQLite example's job, run against `db`, after recording the run as usual.
pub fn fenced_sqlite_command(world: &World, db: &Path) -> String {
    format!(
        "{} && {} {}",
        world.record_command(),
        report_script().display(),
        db.display()
    )
}

/// The example's `report.sh`, for a test that writes as a stale leader would.
pub fn report_script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/fenced-sqlite/report.sh")
}

/// `sqlite3 db sql`'s output.
pub fn sqlite(db: &Path, sql: &str) -> String {
    let out = Command::new("sqlite3")
        .arg(db)
        .arg(sql)
        .output()
        .expect("run sqlite3 (apt-get install sqlite3)");
    assert!(
        out.status.success(),
        "sqlite3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `attempts` rows in the order they started: (job, tick, fence, shard, started_at).
pub fn attempts(db: &Path) -> Vec<(String, String, i64, u32, f64)> {
    sqlite(
        db,
        "SELECT job, tick, fence, shard, started_at FROM attempts ORDER BY started_at",
    )
    .lines()
    .filter_map(|line| {
        let fields: Vec<&str> = line.split('|').collect();
        let [job, tick, fence, shard, started] = fields.as_slice() else {
            return None;
        };
        Some((
            job.to_string(),
            tick.to_string(),
            fence.parse().ok()?,
            shard.parse().ok()?,
            started.parse().ok()?,
        ))
    })
    .collect()
}
