//! The last check before a command runs, made by the child itself.
//!
//! A node may be stopped (SIGSTOP, a stall) between its own lease check and the spawn; once it
//! resumes, a run it starts may belong to a leadership that is over. Checking in the child, right
//! before the command, closes that gap without forking the node: the spawn stays a `posix_spawn`
//! that never copies the node's address space, which a check run between fork and exec
//! (`pre_exec`) would force on every run. The child reads the boot-time clock from
//! `/proc/uptime`, compares it with the deadline the node wrote into its script, and either
//! prints [`PASSED`] and runs the command, or exits with [`REFUSED`] without running it.

use std::time::Instant;

/// The first line a child prints once it passed the gate; the node reads it and does not log it.
pub const PASSED: &str = "shardcron:go";

/// The exit status of a child that found the lease expired and did not run the command.
pub const REFUSED: i32 = 125;

/// `command` behind a check that lets it run only before `deadline` (by the node's monotonic
/// clock). The check shares the command's first line, so the command's own line numbers in the
/// shell's messages stay what the operator wrote.
pub fn script(command: &str, deadline: Instant) -> String {
    let left = deadline.saturating_duration_since(Instant::now()).as_millis() as u64 / 10;
    // Both readings are rounded down to 10 ms: one less keeps the child's check on the safe side.
    let before = (boot_centis() + left).saturating_sub(1);
    format!(
        "{{ read -r shardcron_up _ </proc/uptime && [ \"${{shardcron_up%.*}}${{shardcron_up#*.}}\" -lt {before} ] && unset shardcron_up && echo {PASSED}; }} || exit {REFUSED}; {command}"
    )
}

/// The boot-time clock (it advances like the monotonic one, and through suspend) in 10 ms units,
/// rounded down as `/proc/uptime` shows it: that file prints this clock. Read without a file, so
/// a burst of spawns does not open, read and close one per run.
fn boot_centis() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    now.tv_sec as u64 * 100 + now.tv_nsec as u64 / 10_000_000
}

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::time::Duration;

    use super::*;

    fn sh(script: &str) -> (Option<i32>, String, String) {
        let out = Command::new("sh").arg("-c").arg(script).output().expect("sh");
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    }

    #[test]
    fn a_child_runs_the_command_only_before_the_deadline() {
        let (code, out, _) = sh(&script("echo ran; exit 3", Instant::now() + Duration::from_secs(5)));
        assert_eq!((code, out.as_str()), (Some(3), "shardcron:go\nran\n"));

        let (code, out, _) = sh(&script("echo ran", Instant::now()));
        assert_eq!((code, out.as_str()), (Some(REFUSED), ""));
    }

    #[test]
    fn the_node_reads_the_clock_the_child_reads_in_proc_uptime() {
        let before = boot_centis();
        let text = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
        let after = boot_centis();
        let (seconds, centis) = text.split_whitespace().next().unwrap().split_once('.').unwrap();
        let uptime = seconds.parse::<u64>().unwrap() * 100 + centis.parse::<u64>().unwrap();
        assert!((before..=after).contains(&uptime), "{before} <= {uptime} <= {after}");
    }

    #[test]
    fn the_command_keeps_its_line_numbers_and_variables() {
        let command = "echo \"$shardcron_up\" first\nno_such_command_here";
        let (code, out, err) = sh(&script(command, Instant::now() + Duration::from_secs(5)));
        assert_eq!((code, out.as_str()), (Some(127), "shardcron:go\n first\n"));
        assert!(
            err.contains(" 2: no_such_command_here") || err.contains("line 2: no_such_command_here"),
            "{err}"
        );
    }
}
