//! Following a ledger file that may still be written: each [`Follower::poll`]
//! reads what was appended since the last one and returns the complete lines.
//!
//! - A last line without its `\n` (being written, or torn by a crash) is kept
//!   aside and finished by a later poll; it is never parsed half-written.
//! - If that partial tail disappears (the proxy moved a torn line aside on
//!   restart), it is dropped and reading continues from the last full line.
//! - If the file shrinks below what was read, or is replaced by another file
//!   (new inode), the follower starts over and says so ([`Polled::Reset`]).
//! - A missing file is not an error: the proxy may not have started yet.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use veris_receipt::Line;

/// Bytes read per poll at most, so one poll stays short on a huge ledger.
pub const MAX_READ: usize = 4 << 20;

/// What one poll found.
#[derive(Debug, PartialEq)]
pub enum Polled {
    /// Complete lines appended since the last poll (maybe none), and how
    /// many lines could not be parsed. `more` is true when bytes were left
    /// unread ([`MAX_READ`]): poll again without waiting.
    Lines {
        lines: Vec<Line>,
        bad: usize,
        more: bool,
    },
    /// The file does not exist (yet).
    Missing,
    /// The file was truncated or replaced; reading starts over from its
    /// beginning on the next poll.
    Reset(String),
}

#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    file: Option<(File, u64)>,
    /// Bytes consumed through the last complete line.
    committed: u64,
    /// Bytes of an unterminated last line.
    partial: Vec<u8>,
}

impl Follower {
    pub fn new(path: impl Into<PathBuf>) -> Follower {
        Follower {
            path: path.into(),
            file: None,
            committed: 0,
            partial: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads what was appended since the last poll.
    pub fn poll(&mut self) -> io::Result<Polled> {
        let meta = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if self.file.take().is_some() && self.committed > 0 {
                    return Ok(self.restart("the ledger file was removed"));
                }
                return Ok(Polled::Missing);
            }
            Err(e) => return Err(e),
        };
        if let Some((_, ino)) = &self.file {
            if *ino != meta.ino() {
                return Ok(self.restart("the ledger file was replaced"));
            }
        }
        let len = meta.len();
        if len < self.committed {
            return Ok(self.restart("the ledger file was truncated"));
        }
        if len < self.committed + self.partial.len() as u64 {
            // The unterminated tail was cut off (moved aside as torn): it
            // never counted, so nothing before it changes.
            self.partial.clear();
        }
        if self.file.is_none() {
            let f = File::open(&self.path)?;
            let ino = f.metadata()?.ino();
            self.file = Some((f, ino));
        }
        let from = self.committed + self.partial.len() as u64;
        let want = usize::try_from(len - from)
            .unwrap_or(usize::MAX)
            .min(MAX_READ);
        let mut buf = Vec::new();
        if want > 0 {
            if let Some((f, _)) = &mut self.file {
                f.seek(SeekFrom::Start(from))?;
                buf.reserve(want);
                f.by_ref().take(want as u64).read_to_end(&mut buf)?;
            }
        }
        let more = from + (buf.len() as u64) < len;
        let (lines, bad) = self.take_lines(&buf);
        Ok(Polled::Lines { lines, bad, more })
    }

    fn restart(&mut self, why: &str) -> Polled {
        self.file = None;
        self.committed = 0;
        self.partial.clear();
        Polled::Reset(why.to_string())
    }

    /// Splits `partial + fresh` into complete lines, keeping the unterminated rest.
    fn take_lines(&mut self, fresh: &[u8]) -> (Vec<Line>, usize) {
        let mut lines = Vec::new();
        let mut bad = 0;
        let mut rest = fresh;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(nl);
            let bytes: &[u8] = if self.partial.is_empty() {
                head
            } else {
                self.partial.extend_from_slice(head);
                &self.partial
            };
            self.committed += bytes.len() as u64 + 1;
            if !bytes.is_empty() {
                match serde_json::from_slice::<Line>(bytes) {
                    Ok(line) => lines.push(line),
                    Err(_) => bad += 1,
                }
            }
            self.partial.clear();
            rest = &tail[1..];
        }
        self.partial.extend_from_slice(rest);
        (lines, bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use veris_receipt::ledger::Ledger;
    use veris_receipt::Entry;
    use veris_receipt::PassthroughLine;

    fn tempdir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("veris-tui-follow-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn passthrough(host: &str) -> Entry {
        Entry::Passthrough(PassthroughLine {
            bytes_in: 1,
            bytes_out: 2,
            duration_ms: 3,
            ..PassthroughLine::test(host)
        })
    }

    fn seqs(p: Polled) -> Vec<u64> {
        match p {
            Polled::Lines { lines, bad, .. } => {
                assert_eq!(bad, 0);
                lines.iter().map(|l| l.seq).collect()
            }
            other => panic!("expected lines, got {other:?}"),
        }
    }

    #[test]
    fn follows_appends_torn_tails_and_truncation() {
        let dir = tempdir("torn");
        let path = dir.join("ledger.jsonl");
        let mut f = Follower::new(&path);
        assert_eq!(f.poll().unwrap(), Polled::Missing);

        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger.append(passthrough("a.example")).unwrap();
        ledger.append(passthrough("b.example")).unwrap();
        assert_eq!(seqs(f.poll().unwrap()), vec![1, 2]);
        assert_eq!(seqs(f.poll().unwrap()), Vec::<u64>::new());
        ledger.append(passthrough("c.example")).unwrap();
        drop(ledger);

        // A line written in two parts: nothing until its newline arrives.
        let bytes = std::fs::read(&path).unwrap();
        let third_start = bytes[..bytes.len() - 1]
            .iter()
            .rposition(|&b| b == b'\n')
            .unwrap()
            + 1;
        let third = bytes[third_start..].to_vec();
        std::fs::write(&path, &bytes[..third_start]).unwrap();
        let mut g = Follower::new(&path);
        assert_eq!(seqs(g.poll().unwrap()), vec![1, 2]);
        let mut w = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        w.write_all(&third[..10]).unwrap();
        assert_eq!(seqs(g.poll().unwrap()), Vec::<u64>::new());
        w.write_all(&third[10..]).unwrap();
        assert_eq!(seqs(g.poll().unwrap()), vec![3]);

        // A torn tail that is cut off again (moved aside) is forgotten.
        w.write_all(b"{\"v\":1,\"seq\":4,").unwrap();
        assert_eq!(seqs(g.poll().unwrap()), Vec::<u64>::new());
        w.set_len(bytes.len() as u64).unwrap();
        assert_eq!(seqs(g.poll().unwrap()), Vec::<u64>::new());
        let (ledger, report) = Ledger::open(&path).unwrap();
        assert_eq!(report.next_seq, 4);
        ledger.append(passthrough("d.example")).unwrap();
        assert_eq!(seqs(g.poll().unwrap()), vec![4]);

        // Truncation below what was read starts over.
        w.set_len(0).unwrap();
        assert!(matches!(g.poll().unwrap(), Polled::Reset(_)));
        assert_eq!(seqs(g.poll().unwrap()), Vec::<u64>::new());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replaced_file_starts_over() {
        let dir = tempdir("rotate");
        let path = dir.join("ledger.jsonl");
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger.append(passthrough("a.example")).unwrap();
        drop(ledger);
        let mut f = Follower::new(&path);
        assert_eq!(seqs(f.poll().unwrap()), vec![1]);
        std::fs::rename(&path, dir.join("old.jsonl")).unwrap();
        let (ledger, _) = Ledger::open(&path).unwrap();
        ledger.append(passthrough("x.example")).unwrap();
        ledger.append(passthrough("y.example")).unwrap();
        assert!(matches!(f.poll().unwrap(), Polled::Reset(_)));
        assert_eq!(seqs(f.poll().unwrap()), vec![1, 2]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn garbage_lines_are_counted_not_fatal() {
        let dir = tempdir("bad");
        let path = dir.join("ledger.jsonl");
        std::fs::write(&path, b"not json\n\n").unwrap();
        let mut f = Follower::new(&path);
        match f.poll().unwrap() {
            Polled::Lines { lines, bad, more } => {
                assert!(lines.is_empty());
                assert_eq!(bad, 1);
                assert!(!more);
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
