//! A run's output: the child's first line, which is the lease gate's, then every line of its
//! stdout and stderr in the node's log, inside the run's span.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::MAX_LINE;
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
    let _ = read_bounded_line(stdout, line).await;
}

/// The tasks that forward a run's stdout and stderr to the log.
pub(super) struct Forwarding {
    readers: Vec<JoinHandle<()>>,
}

impl Forwarding {
    /// Forwards both streams in tasks of their own, in the current (the attempt's) span.
    pub(super) fn start(
        stdout: Option<BufReader<impl AsyncRead + Unpin + Send + 'static>>,
        stderr: Option<impl AsyncRead + Unpin + Send + 'static>,
    ) -> Forwarding {
        let mut readers = Vec::with_capacity(2);
        if let Some(stdout) = stdout {
            readers.push(tokio::spawn(forward_lines(stdout, "stdout").in_current_span()));
        }
        if let Some(stderr) = stderr {
            readers.push(tokio::spawn(
                forward_lines(BufReader::new(stderr), "stderr").in_current_span(),
            ));
        }
        Forwarding { readers }
    }

    /// Once the command exited: whatever still holds the pipes open, the readers stop rather
    /// than outlive the run.
    pub(super) async fn finish(self) {
        for mut reader in self.readers {
            if tokio::time::timeout(Duration::from_secs(1), &mut reader).await.is_err() {
                reader.abort();
                tracing::debug!("output reader still open after exit; stopped");
            }
        }
    }
}

async fn forward_lines(mut reader: BufReader<impl AsyncRead + Unpin>, name: &'static str) {
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        match read_bounded_line(&mut reader, &mut line).await {
            Ok(0) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let text = text.trim_end_matches(['\n', '\r']);
                tracing::info!(stream = name, "{text}");
            }
            Err(err) => {
                tracing::debug!(error = %err, "output stream closed");
                return;
            }
        }
    }
}

/// Reads one line into `line`, keeping at most [`MAX_LINE`] bytes of it and discarding the rest.
/// Returns the number of bytes consumed, 0 at end of stream.
async fn read_bounded_line<R: AsyncBufReadExt + Unpin>(reader: &mut R, line: &mut Vec<u8>) -> std::io::Result<usize> {
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
        assert_eq!(read_bounded_line(&mut reader, &mut line).await.unwrap(), MAX_LINE + 101);
        assert_eq!(line.len(), MAX_LINE);
        line.clear();
        read_bounded_line(&mut reader, &mut line).await.unwrap();
        assert_eq!(line, b"next\n");
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
