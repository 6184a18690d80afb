//! What a run keeps of its output: the last `output_tail` bytes of each stream, cut where a
//! UTF-8 character starts, flagged when cut; and what of it the node's log gets (`log_output`).

use std::collections::VecDeque;

use serde::Deserialize;

/// The default `output_tail`, per stream.
pub const DEFAULT_OUTPUT_TAIL: usize = 4 * 1024;

/// The most `output_tail` may keep, per stream: a run's history entry holds both streams' tails,
/// and a claim carries entries, so the tail bounds what one etcd transaction can grow to.
pub const MAX_OUTPUT_TAIL: usize = 64 * 1024;

/// What of a run's output the node's log gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogOutput {
    /// Every line, as it comes.
    #[default]
    All,
    /// The kept tail of each stream, once, when the run ends.
    Tail,
    /// Nothing.
    None,
}

/// A size in bytes from `jobs.toml`: a whole number of bytes, or a string with a unit (`"512B"`,
/// `"4KiB"`, `"64KiB"`, `"4KB"` = 4,000 bytes).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit_bytes: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1024,
        "KB" | "kB" => 1000,
        "MiB" => 1024 * 1024,
        other => {
            return Err(format!(
                "unknown size unit {other:?}: use B, KiB, KB or MiB, as in \"4KiB\""
            ))
        }
    };
    let number: usize = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: write a whole number and a unit, as in \"4KiB\""))?;
    number
        .checked_mul(unit_bytes)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// The last bytes of one output stream, as they come.
#[derive(Debug)]
pub struct Tail {
    keep: usize,
    bytes: VecDeque<u8>,
    /// Bytes came that the tail no longer holds.
    cut: bool,
}

/// A stream's kept tail, as text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Kept {
    pub text: String,
    /// The stream printed more than `text` holds.
    pub truncated: bool,
}

impl Tail {
    pub fn new(keep: usize) -> Tail {
        Tail {
            keep,
            bytes: VecDeque::with_capacity(keep.min(DEFAULT_OUTPUT_TAIL)),
            cut: false,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        let chunk = match chunk.len().checked_sub(self.keep) {
            Some(over) if over > 0 || self.keep == 0 => {
                self.cut |= !chunk.is_empty();
                self.bytes.clear();
                &chunk[over..]
            }
            _ => chunk,
        };
        let over = (self.bytes.len() + chunk.len()).saturating_sub(self.keep);
        if over > 0 {
            self.cut = true;
            self.bytes.drain(..over);
        }
        self.bytes.extend(chunk);
    }

    /// The tail as text of at most `keep` bytes: starting where a character starts (a cut
    /// character's leftover bytes are dropped), bytes that are not UTF-8 replaced by U+FFFD,
    /// and cut again at the front if the replacements made it longer.
    pub fn kept(&self) -> Kept {
        let (front, back) = self.bytes.as_slices();
        let mut bytes = Vec::with_capacity(self.bytes.len());
        bytes.extend_from_slice(front);
        bytes.extend_from_slice(back);
        let mut truncated = self.cut;
        if self.cut {
            let continuation = bytes.iter().take(3).take_while(|&&b| b & 0xC0 == 0x80).count();
            bytes.drain(..continuation);
        }
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if text.len() > self.keep {
            let mut start = text.len() - self.keep;
            while !text.is_char_boundary(start) {
                start += 1;
            }
            text.drain(..start);
            truncated = true;
        }
        Kept { text, truncated }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_size, Kept, Tail};

    #[test]
    fn sizes() {
        for (text, bytes) in [
            ("0", 0),
            ("512", 512),
            ("512B", 512),
            ("4KiB", 4096),
            ("64KiB", 65536),
            ("4KB", 4000),
            ("1MiB", 1 << 20),
            (" 2 KiB ", 2048),
        ] {
            assert_eq!(parse_size(text), Ok(bytes), "{text}");
        }
        for text in ["", "KiB", "4 kb", "-1", "1.5KiB", "4GiB", "99999999999999999999999MiB"] {
            assert!(parse_size(text).is_err(), "{text}");
        }
    }

    fn kept(keep: usize, chunks: &[&[u8]]) -> Kept {
        let mut tail = Tail::new(keep);
        for chunk in chunks {
            tail.push(chunk);
        }
        tail.kept()
    }

    #[test]
    fn keeps_the_last_bytes_and_says_whether_it_cut() {
        assert_eq!(
            kept(8, &[b"abc", b"def"]),
            Kept {
                text: "abcdef".into(),
                truncated: false
            }
        );
        assert_eq!(
            kept(4, &[b"abc", b"def"]),
            Kept {
                text: "cdef".into(),
                truncated: true
            }
        );
        assert_eq!(
            kept(4, &[b"abcdefgh"]),
            Kept {
                text: "efgh".into(),
                truncated: true
            }
        );
        assert_eq!(
            kept(4, &[b"abcd"]),
            Kept {
                text: "abcd".into(),
                truncated: false
            }
        );
        assert_eq!(
            kept(0, &[b"abc"]),
            Kept {
                text: String::new(),
                truncated: true
            }
        );
        assert_eq!(kept(0, &[]), Kept::default());
    }

    #[test]
    fn a_cut_character_is_dropped_whole() {
        // "é" is two bytes, "€" three: keeping 4 bytes of "xé€" cuts into "é".
        assert_eq!(
            kept(4, &["xé€".as_bytes()]),
            Kept {
                text: "€".into(),
                truncated: true
            }
        );
        assert_eq!(
            kept(5, &["xé€".as_bytes()]),
            Kept {
                text: "é€".into(),
                truncated: true
            }
        );
        // Three leftover bytes of a 4-byte character: replaced, they would outgrow the cut.
        assert_eq!(
            kept(4, &["ab😀c".as_bytes()]),
            Kept {
                text: "c".into(),
                truncated: true
            }
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_are_stored_replaced_and_still_bounded() {
        let binary: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let kept = kept(1024, &[&binary]);
        assert!(kept.truncated);
        assert!(kept.text.len() <= 1024, "{}", kept.text.len());
        assert!(kept.text.contains('\u{FFFD}'));
        let invalid = self::kept(16, &[&[0xff, 0xfe, b'o', b'k']]);
        assert_eq!(
            invalid,
            Kept {
                text: "\u{FFFD}\u{FFFD}ok".into(),
                truncated: false
            }
        );
    }
}
