//! `history`'s table, and each run's kept output under its row.

use chrono::{DateTime, Utc};

use crate::rules::record::RunRecord;

/// `history`'s table: one run per line, newest first.
pub fn render(records: &[RunRecord]) -> String {
    render_rows(records, false)
}

/// [`render`], with each run's kept output under its row (`history --output`): each stream
/// that printed, its lines indented behind `| `, control characters but tabs shown escaped so
/// that a run's output cannot drive the terminal.
pub fn render_with_output(records: &[RunRecord]) -> String {
    render_rows(records, true)
}

fn output_block(record: &RunRecord) -> String {
    let Some(output) = &record.output else {
        return "    (no output kept)\n".to_string();
    };
    let mut block = String::new();
    for (name, text, truncated) in [
        ("stdout", &output.stdout, output.stdout_truncated),
        ("stderr", &output.stderr, output.stderr_truncated),
    ] {
        if text.is_empty() {
            continue;
        }
        let cut = if truncated { ", its last bytes" } else { "" };
        block.push_str(&format!("    {name}{cut}:\n"));
        for line in text.trim_end_matches('\n').split('\n') {
            let shown: String = line
                .chars()
                .flat_map(|c| match c {
                    '\t' => vec![c],
                    c if c.is_control() => c.escape_default().collect(),
                    c => vec![c],
                })
                .collect();
            block.push_str(&format!("    | {shown}\n"));
        }
    }
    if block.is_empty() {
        block.push_str("    (printed nothing)\n");
    }
    block
}

fn render_rows(records: &[RunRecord], with_output: bool) -> String {
    let instant = |at: &DateTime<Utc>| at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|record| {
            vec![
                record.scheduled_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                record.trigger.as_str().to_string(),
                record.fence.to_string(),
                record.node.clone(),
                record.outcome_shown(),
                record
                    .exit_code
                    .map_or_else(|| "-".to_string(), |code| code.to_string()),
                record.duration_ms.to_string(),
                record.attempts.to_string(),
                instant(&record.finished_at),
            ]
        })
        .collect();
    let table = crate::text_table::table(
        &[
            "SCHEDULED AT",
            "TRIGGER",
            "FENCE",
            "NODE",
            "OUTCOME",
            "EXIT",
            "DURATION MS",
            "ATTEMPTS",
            "FINISHED AT",
        ],
        &rows,
    );
    if !with_output {
        return table;
    }
    let mut lines = table.lines();
    let mut out = format!("{}\n", lines.next().unwrap_or_default());
    for (line, record) in lines.zip(records) {
        out.push_str(line);
        out.push('\n');
        out.push_str(&output_block(record));
    }
    out
}
