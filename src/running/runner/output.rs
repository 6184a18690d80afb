//! A run's output: the child's first line, which is the lease gate's, then its stdout and
//! stderr: each line in the node's log inside the run's span (`log_output`), and the last bytes
//! of each stream kept for the run's record (`output_tail`).

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::MAX_LINE;
use crate::rules::config::Job;
use crate::rules::output::{Kept, LogOutput, Tail};
use crate::rules::record::RunOutput;
use crate::running::gate;

/// Whether `line`, the child's first, is the gate's: the command runs now.
pub(super) fn is_gate_line(line: &[u8]) -> bool {
    line.strip_suffix(b"\n") == Some(gate::PASSED.as_bytes())
}

/// Reads the child's first line into `line`. Cancel-safe: what was read before a cancel stays in
/// `line`, so a read given up on a timeout can be finished once the child is gone.
pub(super) async fn first_line<R: AsyncRead + Unpin>(stdout: &mut BufReader<R>, line: &mut Vec<u8>) {
    if line.ends_with(b"\n") {
        return;
    }
    let _ = read_bounded_line(stdout, line, &mut |_| {}).await;
}

/// The tasks that read a run's stdout and stderr, and what they keep of them.
pub(super) struct Forwarding {
    readers: Vec<JoinHandle<()>>,
    tails: Option<[Arc<Mutex<Tail>>; 2]>,
    log: LogOutput,
}

impl Forwarding {
    /// Reads both streams in tasks of their own, in the current (the attempt's) span.
    pub(super) fn start(
        stdout: Option<BufReader<impl AsyncRead + Unpin + Send + 'static>>,
        stderr: Option<impl AsyncRead + Unpin + Send + 'static>,
        job: &Job,
    ) -> Forwarding {
        let keeps = job.output_tail > 0;
        let tails = [(); 2].map(|()| Arc::new(Mutex::new(Tail::new(job.output_tail))));
        let each_line = job.log_output == LogOutput::All;
        let mut readers = Vec::with_capacity(2);
        if let Some(stdout) = stdout {
            let reader = forward_lines(stdout, "stdout", Arc::clone(&tails[0]), keeps, each_line);
            readers.push(tokio::spawn(reader.in_current_span()));
        }
        if let Some(stderr) = stderr {
            let reader = forward_lines(
                BufReader::new(stderr),
                "stderr",
                Arc::clone(&tails[1]),
                keeps,
                each_line,
            );
            readers.push(tokio::spawn(reader.in_current_span()));
        }
        Forwarding {
            readers,
            tails: keeps.then_some(tails),
            log: job.log_output,
        }
    }

    /// Once the command exited: whatever still holds the pipes open, the readers stop rather
    /// than outlive the run. Returns the kept tails, logged once if the job logs only those.
    pub(super) async fn finish(self) -> Option<RunOutput> {
        for mut reader in self.readers {
            if tokio::time::timeout(Duration::from_secs(1), &mut reader).await.is_err() {
                reader.abort();
                tracing::debug!("output reader still open after exit; stopped");
            }
        }
        let [stdout, stderr] = self
            .tails?
            .map(|tail| tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).kept());
        if self.log == LogOutput::Tail {
            for (name, kept) in [("stdout", &stdout), ("stderr", &stderr)] {
                if !kept.text.is_empty() {
                    for line in log_lines(&kept.text) {
                        tracing::info!(stream = name, truncated = kept.truncated, "{line}");
                    }
                }
            }
        }
        let (
            Kept {
                text: stdout,
                truncated: stdout_truncated,
            },
            Kept {
                text: stderr,
                truncated: stderr_truncated,
            },
        ) = (stdout, stderr);
        Some(RunOutput {
            stdout,
            stderr,
            stdout_truncated,
            stderr_truncated,
        })
    }
}

async fn forward_lines(
    mut reader: BufReader<impl AsyncRead + Unpin>,
    name: &'static str,
    tail: Arc<Mutex<Tail>>,
    keeps: bool,
    each_line: bool,
) {
    let mut line = Vec::with_capacity(256);
    let mut keep = |bytes: &[u8]| {
        if keeps {
            tail.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).push(bytes);
        }
    };
    loop {
        line.clear();
        match read_bounded_line(&mut reader, &mut line, &mut keep).await {
            Ok(0) => return,
            Ok(_) if each_line => {
                for text in log_lines(&String::from_utf8_lossy(&line)) {
                    tracing::info!(stream = name, "{text}");
                }
            }
            Ok(_) => {}
            Err(err) => {
                tracing::debug!(error = %err, "output stream closed");
                return;
            }
        }
    }
}

/// `text` (a job's output) as lines fit for the node's log: one per `\n`, its line ending
/// dropped, and any other `\r` shown as `\r`. The log's text format writes a message as it is,
/// and journald makes each line an entry of its own: a raw `\n`, or a `\r` that sends a
/// terminal back to the line's start, would let a job write lines that pass for the node's own.
fn log_lines(text: &str) -> impl Iterator<Item = Cow<'_, str>> {
    text.trim_end_matches(['\n', '\r']).split('\n').map(|line| {
        let line = line.strip_suffix('\r').unwrap_or(line);
        match line.contains('\r') {
            true => Cow::Owned(line.replace('\r', "\\r")),
            false => Cow::Borrowed(line),
        }
    })
}

/// Reads one line into `line`, keeping at most [`MAX_LINE`] bytes of it and discarding the rest;
/// `seen` gets every byte consumed, the discarded ones too. Returns the number of bytes
/// consumed, 0 at end of stream.
async fn read_bounded_line<R: AsyncBufReadExt + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    seen: &mut impl FnMut(&[u8]),
) -> std::io::Result<usize> {
    let mut consumed = 0;
    loop {
        let buffer = reader.fill_buf().await?;
        if buffer.is_empty() {
            return Ok(consumed);
        }
        let (take, done) = match buffer.iter().position(|&b| b == b'\n') {
            Some(newline) => (newline + 1, true),
            None => (buffer.len(), false),
        };
        let room = MAX_LINE.saturating_sub(line.len());
        line.extend_from_slice(&buffer[..take.min(room)]);
        seen(&buffer[..take]);
        reader.consume(take);
        consumed += take;
        if done {
            return Ok(consumed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_long_line_is_cut_and_the_next_one_read_whole() {
        let mut input = vec![b'x'; MAX_LINE + 100];
        input.extend_from_slice(b"\nnext\n");
        let mut reader = BufReader::new(&input[..]);
        let mut line = Vec::new();
        let mut tail = Tail::new(8);
        let mut seen = |bytes: &[u8]| tail.push(bytes);
        assert_eq!(
            read_bounded_line(&mut reader, &mut line, &mut seen).await.unwrap(),
            MAX_LINE + 101
        );
        assert_eq!(line.len(), MAX_LINE);
        line.clear();
        read_bounded_line(&mut reader, &mut line, &mut seen).await.unwrap();
        assert_eq!(line, b"next\n");
        // The tail holds the stream's last bytes, the discarded part of the long line included.
        assert_eq!(tail.kept().text, "xx\nnext\n");
    }

    #[test]
    fn output_reaches_the_log_one_line_at_a_time_with_no_carriage_return() {
        let cases: [(&str, &[&str]); 7] = [
            ("one\n", &["one"]),
            ("one\r\n", &["one"]),
            ("one\ntwo\n", &["one", "two"]),
            (
                "one\n2099-01-01T00:00:00Z WARN forged\n",
                &["one", "2099-01-01T00:00:00Z WARN forged"],
            ),
            ("a\rforged\n", &["a\\rforged"]),
            ("a\n\nb", &["a", "", "b"]),
            ("no end", &["no end"]),
        ];
        for (text, expected) in cases {
            let got: Vec<Cow<str>> = log_lines(text).collect();
            assert_eq!(got, expected, "{text:?}");
        }
    }

    #[tokio::test]
    async fn only_the_gates_line_says_the_command_runs() {
        for (input, passed) in [
            ("shardcron:go\nout\n", true),
            ("shardcron:go", false),
            ("other\n", false),
            ("", false),
        ] {
            let mut reader = BufReader::new(input.as_bytes());
            let mut line = Vec::new();
            first_line(&mut reader, &mut line).await;
            assert_eq!(is_gate_line(&line), passed, "{input:?}");
        }
    }
}
