//! The end of an output stream that went over its cap: the relay keeps
//! reading past the cap (so the program is never blocked on a full pipe)
//! and keeps the last bytes it read, so that a result shows the stream's
//! head (as far as the cap) and its tail, where a long program's last
//! lines and its summary usually are.

use std::collections::VecDeque;

use pycell_wire::report::StreamTail;

/// The most of a stream's end kept past its cap.
pub const TAIL_BYTES: usize = 16 << 10;

/// What came past the cap: its last bytes, and how many there were.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    keep: usize,
    last: VecDeque<u8>,
    past_cap: u64,
}

impl Tail {
    /// A tail of at most [`TAIL_BYTES`], and no more than the cap itself
    /// (the head's size): a small cap gets a small tail.
    pub fn new(cap: u64) -> Tail {
        Tail {
            keep: usize::try_from(cap).map_or(TAIL_BYTES, |c| c.min(TAIL_BYTES)),
            ..Tail::default()
        }
    }

    /// Bytes read past the cap.
    pub fn push(&mut self, bytes: &[u8]) {
        self.past_cap += bytes.len() as u64;
        let bytes = &bytes[bytes.len().saturating_sub(self.keep)..];
        let over = (self.last.len() + bytes.len()).saturating_sub(self.keep);
        self.last.drain(..over);
        self.last.extend(bytes);
    }

    /// The tail for the result, if anything came past the cap.
    pub fn take(&mut self) -> Option<StreamTail> {
        if self.past_cap == 0 {
            return None;
        }
        let last: Vec<u8> = std::mem::take(&mut self.last).into();
        let tail = StreamTail {
            skipped_bytes: self.past_cap - last.len() as u64,
            tail: String::from_utf8_lossy(&last).into_owned(),
            rest_file: None,
            rest_file_bytes: 0,
        };
        self.past_cap = 0;
        Some(tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_last_bytes_past_the_cap_are_kept_and_the_rest_counted() {
        let mut t = Tail::new(1 << 20);
        assert!(t.take().is_none(), "nothing past the cap: no tail");
        for i in 0..10_000u32 {
            t.push(format!("line {i}\n").as_bytes());
        }
        let total: u64 = (0..10_000u32)
            .map(|i| format!("line {i}\n").len() as u64)
            .sum();
        let tail = t.take().unwrap();
        assert_eq!(tail.tail.len(), TAIL_BYTES);
        assert!(
            tail.tail.ends_with("line 9999\n"),
            "{}",
            &tail.tail[tail.tail.len() - 20..]
        );
        assert_eq!(tail.skipped_bytes, total - TAIL_BYTES as u64);
        assert!(t.take().is_none(), "taken once");
    }

    #[test]
    fn a_chunk_larger_than_the_tail_and_a_small_cap() {
        let mut t = Tail::new(8);
        t.push(b"abc");
        t.push(b"0123456789");
        let tail = t.take().unwrap();
        assert_eq!((tail.tail.as_str(), tail.skipped_bytes), ("23456789", 5));
    }
}
