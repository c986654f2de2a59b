//! What a ledger's session lines say, read a line at a time: the window's
//! start, the twin log position recorded there, the keys offered, and the
//! prefix a ledger id is read from.

use std::collections::BTreeMap;
use std::path::Path;

use veris_receipt::ledger::LedgerRead;
use veris_receipt::{Entry, SessionLine};

/// What the newest session line at or before a window's end says, and the
/// public keys every session line offers.
#[derive(Debug, Default)]
pub struct SessionFacts {
    /// `seq - 1` of that session line (0 without one).
    pub since: u64,
    /// The twin log position it recorded.
    pub twin_heads: Option<BTreeMap<String, u64>>,
    /// `public_key` of every session line, in file order.
    pub public_keys: Vec<String>,
    /// The first two lines and the head: what a ledger id is read from.
    pub prefix: LedgerRead,
}

impl SessionFacts {
    fn add(&mut self, line: &veris_receipt::Line, until: u64) {
        if let Entry::Session(SessionLine {
            twin_heads,
            public_key,
            ..
        }) = &line.entry
        {
            if let Some(k) = public_key {
                self.public_keys.push(k.clone());
            }
            if line.seq <= until {
                self.since = line.seq.saturating_sub(1);
                self.twin_heads = twin_heads.clone();
            }
        }
    }

    /// Reads them from the file a line at a time: only the first two lines
    /// and lines that mention a session are parsed (any line holding a
    /// `session` line's tag holds the word).
    pub fn of_file(path: &Path, until: u64) -> Result<SessionFacts, veris_receipt::LedgerError> {
        use veris_receipt::ledger::{LineReader, RawLine};
        let mut f = SessionFacts::default();
        let file = match veris_receipt::ledger::open_ledger(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(f),
            Err(source) => {
                return Err(veris_receipt::LedgerError::Read {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let mut lines = LineReader::new(file);
        let mut buf = Vec::new();
        let mut head_hash = None;
        let mut n = 0u64;
        let mentions_session = veris_receipt::ledger::mentions(b"session");
        while let Some(raw) =
            lines
                .next_into(&mut buf)
                .map_err(|source| veris_receipt::LedgerError::Read {
                    path: path.to_path_buf(),
                    source,
                })?
        {
            let hash = match raw {
                RawLine::Line => None,
                RawLine::Overlong { hash, .. } => Some(hash),
                RawLine::Torn(_) => break,
            };
            n += 1;
            if n <= 2 || mentions_session(&buf) {
                if let Ok(line) = serde_json::from_slice::<veris_receipt::Line>(&buf) {
                    if f.prefix.lines.len() < 2 && n <= 2 {
                        f.prefix.lines.push(line.clone());
                    }
                    f.add(&line, until);
                }
            }
            if n == 1 {
                head_hash = Some(hash.unwrap_or_else(|| veris_receipt::ledger::line_hash(&buf)));
            }
        }
        if n == 1 {
            f.prefix.head = (1, head_hash.unwrap_or_default());
        }
        Ok(f)
    }
}
