//! Reading a ledger from its end, for a writer that continues a file
//! without reading its history ([`super::Ledger::open_sealed_by`]), and
//! finding a line by seq without an index.
//!
//! A proxy continues a file only when its last line is a seal by the
//! proxy's own key over the line right before it (DESIGN §7a.4): that seal
//! vouches, through the hash chain, for every line up to it, so the start
//! reads two lines however long the history is. Whether the history still
//! matches the chain is what every reader checks anyway (a receipt streams
//! the whole file and fails on any break, whatever its window), so an edit
//! made between sessions can never pass for verified; the writer only
//! refuses to seal over a tail it cannot vouch for.

use std::fs::File;
use std::io;

use crate::entry::{Entry, Line};
use crate::hash::line_hash;
use crate::seal::{PublicKeys, SealReport};

use super::read::{mentions, MAX_LINE};

/// Bytes read at a time when walking backwards.
const BLOCK: usize = 64 * 1024;

/// What the end of a file says.
#[derive(Debug, Default)]
pub(super) struct Tail {
    /// Length up to and including the last `\n`.
    pub good_len: u64,
    /// Bytes after the last `\n` (a torn last line).
    pub torn: usize,
    /// Seq (0 when it does not parse) and hash of the last complete line.
    pub last: Option<(u64, String)>,
    /// Why the writer holding `own` cannot vouch for the file; `None` when
    /// its last line is a seal by `own` over the line before it (or the
    /// file has no complete line).
    pub why: Option<String>,
}

/// A complete line found walking backwards.
enum Back {
    /// Its bytes (without `\n`) and offset.
    Line { start: u64, bytes: Vec<u8> },
    /// Longer than [`MAX_LINE`]: only where it starts.
    Overlong { start: u64 },
}

impl Back {
    fn start(&self) -> u64 {
        match self {
            Back::Line { start, .. } | Back::Overlong { start } => *start,
        }
    }
}

fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The complete line that ends right before `end` (the offset of its
/// `\n`, or of the end of the file's good part), if `end > 0`.
fn line_before(file: &File, end: u64) -> io::Result<Option<Back>> {
    if end == 0 {
        return Ok(None);
    }
    // The line's bytes, gathered back to front in blocks.
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    let mut len = 0usize;
    let mut pos = end;
    let start = loop {
        if pos == 0 {
            break 0;
        }
        let n = BLOCK.min(pos as usize);
        let mut block = vec![0u8; n];
        let got = read_at(file, &mut block, pos - n as u64)?;
        if got < n {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the ledger file shrank while it was read",
            ));
        }
        pos -= n as u64;
        match memchr::memrchr(b'\n', &block) {
            Some(i) => {
                let piece = block.split_off(i + 1);
                len += piece.len();
                blocks.push(piece);
                break pos + i as u64 + 1;
            }
            None => {
                len += block.len();
                blocks.push(block);
            }
        }
        if len > MAX_LINE {
            // Find where it starts without keeping it.
            blocks.clear();
            let mut p = pos;
            let start = loop {
                if p == 0 {
                    break 0;
                }
                let n = BLOCK.min(p as usize);
                let mut block = vec![0u8; n];
                read_at(file, &mut block, p - n as u64)?;
                p -= n as u64;
                if let Some(i) = memchr::memrchr(b'\n', &block) {
                    break p + i as u64 + 1;
                }
            };
            return Ok(Some(Back::Overlong { start }));
        }
    };
    let mut bytes = Vec::with_capacity(len);
    for b in blocks.iter().rev() {
        bytes.extend_from_slice(b);
    }
    Ok(Some(Back::Line { start, bytes }))
}

/// Reads the end of `file`: the torn tail, the last line, and whether the
/// writer holding `own` can vouch for the file (see [`Tail::why`]).
pub(super) fn check(file: &File, own: &PublicKeys) -> io::Result<Tail> {
    let len = file.metadata()?.len();
    // The last `\n`.
    let mut good_len = 0;
    let mut pos = len;
    while pos > 0 {
        let n = BLOCK.min(pos as usize);
        let mut block = vec![0u8; n];
        read_at(file, &mut block[..], pos - n as u64)?;
        pos -= n as u64;
        if let Some(i) = memchr::memrchr(b'\n', &block) {
            good_len = pos + i as u64 + 1;
            break;
        }
    }
    let mut tail = Tail {
        good_len,
        torn: (len - good_len) as usize,
        ..Tail::default()
    };
    let Some(last) = line_before(file, good_len.saturating_sub(1))? else {
        return Ok(tail);
    };
    let Back::Line { start, bytes } = &last else {
        tail.last = Some((0, String::new()));
        tail.why = Some(why_not(file, own, last)?);
        return Ok(tail);
    };
    let parsed = serde_json::from_slice::<Line>(bytes).ok();
    tail.last = Some((parsed.as_ref().map_or(0, |l| l.seq), line_hash(bytes)));
    let Some(
        seal @ Line {
            entry: Entry::Seal { sealed_seq, .. },
            ..
        },
    ) = parsed.as_ref()
    else {
        tail.why = Some(why_not(file, own, last)?);
        return Ok(tail);
    };
    let mut report = SealReport::default();
    report.check(seal, own);
    if let Some((seq, fault)) = report.faults.first() {
        tail.why = Some(format!("seal at seq {seq} {fault}"));
        return Ok(tail);
    }
    // The seal signs the hash it names; the line before must be that line.
    let before = line_before(file, start.saturating_sub(1))?;
    let matches = match &before {
        Some(Back::Line { bytes, .. }) => {
            line_hash(bytes) == seal.prev
                && serde_json::from_slice::<Line>(bytes).is_ok_and(|l| l.seq == *sealed_seq)
        }
        _ => false,
    };
    if !matches {
        tail.why = Some(format!(
            "chain broken at seq {}: the line before the last seal is not the line it sealed",
            seal.seq
        ));
    }
    Ok(tail)
}

/// Why a file whose last line is not a valid seal by `own` cannot be
/// continued: the newest seal's fault, the lines after the newest valid
/// seal, or no seals. Walks back from `last` (the failure path only) and
/// parses only the lines that mention a seal.
fn why_not(file: &File, own: &PublicKeys, last: Back) -> io::Result<String> {
    let mut after = 0u64;
    let mut cur = Some(last);
    let mentions_seal = mentions(b"seal");
    while let Some(back) = cur {
        if let Back::Line { bytes, .. } = &back {
            if mentions_seal(bytes) {
                if let Ok(line) = serde_json::from_slice::<Line>(bytes) {
                    if matches!(line.entry, Entry::Seal { .. }) {
                        let mut report = SealReport::default();
                        report.check(&line, own);
                        return Ok(match report.faults.first() {
                            Some((seq, fault)) => format!("seal at seq {seq} {fault}"),
                            None => {
                                format!("{after} line(s) after the last seal (seq {})", line.seq)
                            }
                        });
                    }
                }
            }
        }
        after += 1;
        cur = line_before(file, back.start().saturating_sub(1))?;
    }
    Ok("no seals".into())
}

/// The seq written in a line's first bytes (`{"v":3,"seq":N,...`).
fn sniff_seq(head: &[u8]) -> Option<u64> {
    let at = memchr::memmem::find(head, b"\"seq\":")? + 6;
    let digits = head[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&head[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

/// A byte offset in `file[..len]` at the start of a line whose seq is at
/// most `target`, close before the first line with a greater seq (a binary
/// search over byte offsets, reading a few blocks): where a reader of the
/// lines after `target - 1` starts. Assumes seqs ascend, as in any file
/// the writer wrote; the reader checks what it finds there. 0 when in doubt.
pub(super) fn offset_of_seq(file: &File, len: u64, target: u64) -> io::Result<u64> {
    // `lo` is a line start with seq <= target (or 0); no line starting at
    // or after `hi` has seq <= target.
    let (mut lo, mut hi) = (0u64, len);
    let mut block = vec![0u8; 4096];
    while hi - lo > BLOCK as u64 {
        let mid = lo + (hi - lo) / 2;
        // The first line start after `mid`.
        let mut p = mid;
        let start = loop {
            if p >= hi {
                break None;
            }
            let n = read_at(file, &mut block, p)?;
            if n == 0 {
                break None;
            }
            if let Some(i) = memchr::memchr(b'\n', &block[..n]) {
                break Some(p + i as u64 + 1);
            }
            p += n as u64;
        };
        let Some(start) = start.filter(|s| *s < hi) else {
            hi = mid;
            continue;
        };
        let n = read_at(file, &mut block, start)?;
        match sniff_seq(&block[..n.min(256)]) {
            Some(seq) if seq <= target => lo = start,
            Some(_) => hi = start,
            None => return Ok(0),
        }
    }
    Ok(lo)
}

/// The file's last complete line, parsed (`None`: none, or it does not
/// parse, or it is longer than [`MAX_LINE`]): what a chain ends in,
/// without reading its history.
pub fn last_line(file: &File) -> io::Result<Option<Line>> {
    let len = file.metadata()?.len();
    let mut end = len;
    // A torn tail (no `\n` yet) is not a line.
    let mut last = [0u8; 1];
    if len > 0 && read_at(file, &mut last, len - 1)? == 1 && last[0] != b'\n' {
        end = match line_before(file, len)? {
            Some(b) => b.start().saturating_sub(1),
            None => 0,
        };
    } else {
        end = end.saturating_sub(1);
    }
    Ok(match line_before(file, end)? {
        Some(Back::Line { bytes, .. }) => serde_json::from_slice(&bytes).ok(),
        _ => None,
    })
}

/// Line `seq` of `file`, parsed: found by [`offset_of_seq`] and read
/// forward from there, so a few blocks whatever the file's length, a line
/// at a time and never more than [`MAX_LINE`] of one. `None` when no
/// complete line of the file has that seq (or it does not parse). For a
/// reader that must know what a file says at one seq (whether the session
/// line a live proxy names is in this file) without reading its history.
pub fn line_at(file: &File, seq: u64) -> io::Result<Option<Line>> {
    use super::read::{LineReader, RawLine};
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata()?.len();
    let mut from = offset_of_seq(file, len, seq)?;
    let mut buf = Vec::new();
    loop {
        let mut f = file;
        f.seek(SeekFrom::Start(from))?;
        let mut lines = LineReader::at(f.take(len - from), from);
        // Whether the search's assumption held: the line it found is at or
        // before `seq`.
        let mut first = true;
        let mut misplaced = false;
        while let Some(raw) = lines.next_into(&mut buf)? {
            if raw != RawLine::Line {
                continue;
            }
            let found = sniff_seq(&buf[..buf.len().min(256)]);
            match found {
                Some(s) if s == seq => return Ok(serde_json::from_slice::<Line>(&buf).ok()),
                // Past it: seqs ascend in any file a writer wrote.
                Some(s) if s > seq => {
                    misplaced = first;
                    break;
                }
                _ => {}
            }
            first = false;
        }
        // The search assumes ascending seqs; when its line is already past
        // `seq`, read from the start once.
        if from == 0 || !misplaced {
            return Ok(None);
        }
        from = 0;
    }
}
