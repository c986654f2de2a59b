//! The verifying reader. It walks a ledger line by line from any reader,
//! holding one line (at most [`MAX_LINE`] bytes) and a few links of chain
//! state, so its memory does not grow with the file: every line is checked
//! (JSON, `v`, gapless `seq`, `prev` against the previous line's hash) and
//! handed to a fold ([`scan`]); defects are reported by 1-based line number.
//! [`read`] and [`read_bytes`] collect the lines for callers that want them
//! all. It never panics on bad input.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::sync::Mutex;

use crate::entry::{Entry, Line, TornTail, GENESIS_PREV, KINDS, READABLE_VERSIONS};
use crate::hash::{line_hash_into, LineHasher};

use super::{LedgerError, LedgerRead, Problem};

/// The longest line the reader parses. The writer never writes a longer one
/// (it refuses the entry), so a longer line is a problem, not an allocation.
pub const MAX_LINE: usize = 1 << 20;

/// Problems kept by a streaming scan ([`scan`]); the count stays exact in
/// [`LedgerRead::problem_count`]. A file of garbage must not cost a
/// [`Problem`] per line of memory.
pub const PROBLEM_CAP: usize = 1000;

/// Reads and verifies a ledger file, keeping every line. A missing file is
/// an empty ledger. Prefer [`scan_file`] with a fold where the lines are
/// only summarized: this holds the whole history in memory.
pub fn read(path: &Path) -> Result<LedgerRead, LedgerError> {
    let mut lines = Vec::new();
    let mut read = scan_file(path, usize::MAX, |line, _, _| lines.push(line.clone()))?;
    read.lines = lines;
    Ok(read)
}

/// Reads and verifies ledger bytes: JSON, `v`, gapless `seq` from 1, and
/// `prev` against the previous line's hash. Unknown kinds and malformed
/// lines are problems, never panics.
pub fn read_bytes(bytes: &[u8]) -> LedgerRead {
    let mut lines = Vec::new();
    // Reading from a slice cannot fail.
    let mut read =
        scan(bytes, usize::MAX, |line, _, _| lines.push(line.clone())).unwrap_or_default();
    read.lines = lines;
    read
}

/// [`scan`] over a file; a missing file is an empty ledger.
/// Opens a ledger for reading: a regular file only, opened without blocking,
/// so a FIFO (or a device) the workload planted at the ledger's path is an
/// error, not a reader (an MCP tool call, `veris receipt`) stuck forever.
pub fn open_ledger(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    Ok(f)
}

pub fn scan_file(
    path: &Path,
    problem_cap: usize,
    visit: impl FnMut(&Line, &str, u64),
) -> Result<LedgerRead, LedgerError> {
    let read_err = |source| LedgerError::Read {
        path: path.to_path_buf(),
        source,
    };
    match open_ledger(path) {
        Ok(f) => scan(f, problem_cap, visit).map_err(read_err),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(scan(&[][..], problem_cap, visit).unwrap_or_default())
        }
        Err(e) => Err(read_err(e)),
    }
}

/// Verifies a ledger from `reader`, line by line, and hands every line that
/// parsed to `visit` with its hash and its byte offset in the file. The
/// result has no `lines`; its problems (the first `problem_cap`, sorted by
/// line), torn tail, head and good length are those of [`read_bytes`].
///
/// Three stages, so a big ledger is read at the speed of the machine's
/// cores, not of one: a thread splits the input into batches of lines,
/// workers hash and parse batches (neither depends on another line), and
/// this thread checks the chain and calls `visit` in file order. Batches
/// in flight are bounded, so memory stays a few batches whatever the size.
/// A batch goes back to the worker that parsed it to be dropped: memory is
/// freed by the thread that allocated it, which the allocator does fastest.
pub fn scan<R: Read + Send>(
    reader: R,
    problem_cap: usize,
    mut visit: impl FnMut(&Line, &str, u64),
) -> std::io::Result<LedgerRead> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().clamp(1, 4));
    let mut v = Verifier::new(problem_cap);
    let (work_tx, work_rx) = sync_channel::<(Batch, SyncSender<Parsed>)>(workers);
    let work_rx = Mutex::new(work_rx);
    // Results in file order: one receiver per batch, queued when it is read,
    // so the chain check takes them in order whichever worker ends first.
    let (order_tx, order_rx) = sync_channel::<Receiver<Parsed>>(2 * workers);
    let (used_tx, used_rx): (Vec<_>, Vec<_>) = (0..workers).map(|_| channel::<Vec<Item>>()).unzip();
    // Read batches go back to the splitter to be filled again: a fresh
    // buffer per batch cost an allocation of its size (and its growth).
    let (spare_tx, spare_rx) = channel::<Batch>();
    std::thread::scope(|s| {
        let split = s.spawn(move || split(reader, &work_tx, &order_tx, &spare_rx));
        for (worker, used) in used_rx.into_iter().enumerate() {
            let (work_rx, spare_tx) = (&work_rx, spare_tx.clone());
            s.spawn(move || {
                let mut spare_items: Vec<Vec<Item>> = Vec::new();
                loop {
                    // Take back what the chain check is done with before
                    // parsing more: its vector and the buffers of its
                    // lines hold the next batch's lines.
                    while let Ok(items) = used.try_recv() {
                        spare_items.push(items);
                    }
                    // A poisoned lock means another worker panicked: stop too.
                    let Ok(next) = work_rx.lock().map(|rx| rx.recv()) else {
                        return;
                    };
                    let Ok((mut batch, done)) = next else { return };
                    let mut items = spare_items.pop().unwrap_or_default();
                    batch.prepare(&mut items);
                    batch.clear();
                    let _ = spare_tx.send(batch);
                    let _ = done.send(Parsed { worker, items });
                }
            });
        }
        drop(spare_tx);
        for done in order_rx {
            // A batch with no answer was lost to a panicking worker; the
            // join below reports the reader's side, the scope the panic.
            let Ok(parsed) = done.recv() else { break };
            for item in &parsed.items {
                match item {
                    Item::Line { pre, start, end } => {
                        if let Some(line) = v.accept(pre) {
                            visit(line, &pre.hash, *start);
                        }
                        v.out.good_len = *end;
                    }
                    Item::Overlong { len, hash, end } => {
                        v.overlong(hash, *len);
                        v.out.good_len = *end;
                    }
                }
            }
            // A worker that has ended cannot take it back: dropped here.
            let _ = used_tx[parsed.worker].send(parsed.items);
        }
        let torn = split
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))?;
        Ok(v.finish(torn))
    })
}

/// A batch's lines, hashed and parsed, and which worker did it.
struct Parsed {
    worker: usize,
    items: Vec<Item>,
}

/// Lines per batch, and the bytes after which a batch is sent early.
const BATCH_LINES: usize = 256;
const BATCH_BYTES: usize = 128 * 1024;

/// Consecutive lines of the input, as split by [`LineReader`].
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    raw: Vec<BatchLine>,
}

enum BatchLine {
    /// `bytes[from..to]`, which starts at `start` in the file and whose
    /// `\n` ends at `end`.
    Line {
        from: usize,
        to: usize,
        start: u64,
        end: u64,
    },
    Overlong {
        len: usize,
        hash: String,
        end: u64,
    },
}

/// A batch's lines, hashed and parsed.
// Nearly every item is a `Line`: boxing it would cost an allocation each.
#[allow(clippy::large_enum_variant)]
enum Item {
    Line { pre: Pre, start: u64, end: u64 },
    Overlong { len: usize, hash: String, end: u64 },
}

impl Batch {
    /// Hashes and parses the batch's lines into `items`, in place of the
    /// items of an earlier batch it may hold: their lines' buffers are
    /// reused, and a parsed line (hundreds of bytes) is not moved.
    fn prepare(&mut self, items: &mut Vec<Item>) {
        let n = self.raw.len();
        for (i, raw) in self.raw.drain(..).enumerate() {
            let item = match raw {
                BatchLine::Line {
                    from,
                    to,
                    start,
                    end,
                } => {
                    let raw = &self.bytes[from..to];
                    if let Some(Item::Line {
                        pre,
                        start: at,
                        end: to,
                    }) = items.get_mut(i)
                    {
                        pre.parse(raw);
                        (*at, *to) = (start, end);
                        continue;
                    }
                    Item::Line {
                        pre: Pre::of(raw),
                        start,
                        end,
                    }
                }
                BatchLine::Overlong { len, hash, end } => Item::Overlong { len, hash, end },
            };
            match items.get_mut(i) {
                Some(slot) => *slot = item,
                None => items.push(item),
            }
        }
        items.truncate(n);
    }

    /// Empty, keeping its buffers for the next lines.
    fn clear(&mut self) {
        self.bytes.clear();
        self.raw.clear();
    }
}

/// The first stage of [`scan`]: reads lines into batches, queues each for a
/// worker and its answer for the chain check. Returns the torn tail's size.
fn split<R: Read>(
    reader: R,
    work: &SyncSender<(Batch, SyncSender<Parsed>)>,
    order: &SyncSender<Receiver<Parsed>>,
    spare: &Receiver<Batch>,
) -> std::io::Result<usize> {
    let mut lines = LineReader::new(reader);
    let mut buf = Vec::new();
    let next_batch = || spare.try_recv().unwrap_or_default();
    let mut batch = next_batch();
    let send = |batch: Batch| {
        let (done_tx, done_rx) = sync_channel(1);
        // Either side gone means the scan is over (a panic elsewhere).
        work.send((batch, done_tx)).is_ok() && order.send(done_rx).is_ok()
    };
    loop {
        let start = lines.offset();
        let raw = lines.next_into(&mut buf);
        let end = lines.offset();
        match raw {
            Ok(Some(RawLine::Line)) => {
                let from = batch.bytes.len();
                batch.bytes.extend_from_slice(&buf);
                batch.raw.push(BatchLine::Line {
                    from,
                    to: batch.bytes.len(),
                    start,
                    end,
                });
            }
            Ok(Some(RawLine::Overlong { len, hash })) => {
                batch.raw.push(BatchLine::Overlong { len, hash, end })
            }
            Ok(Some(RawLine::Torn(n))) => {
                send(batch);
                return Ok(n);
            }
            Ok(None) => {
                send(batch);
                return Ok(0);
            }
            Err(e) => return Err(e),
        }
        if (batch.raw.len() >= BATCH_LINES || batch.bytes.len() >= BATCH_BYTES)
            && !send(std::mem::replace(&mut batch, next_batch()))
        {
            return Ok(0);
        }
    }
}

/// A test for whether `word` occurs in a line (cheap, before parsing the
/// line), built once for all the lines of a file.
pub fn mentions(word: &[u8]) -> impl Fn(&[u8]) -> bool + '_ {
    let finder = memchr::memmem::Finder::new(word);
    move |line| finder.find(line).is_some()
}

/// What [`LineReader::next_into`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum RawLine {
    /// A complete line, now in the buffer (without its `\n`).
    Line,
    /// A complete line longer than [`MAX_LINE`]: its length and hash only.
    Overlong { len: usize, hash: String },
    /// Bytes after the last `\n` (a torn tail, or a line being written): how many.
    Torn(usize),
}

/// Splits a ledger into lines without ever holding more than [`MAX_LINE`]
/// bytes of one.
pub struct LineReader<R> {
    reader: BufReader<R>,
    offset: u64,
}

impl<R: Read> LineReader<R> {
    pub fn new(reader: R) -> LineReader<R> {
        LineReader::at(reader, 0)
    }

    /// A reader already positioned at byte `offset` of the file.
    pub fn at(reader: R, offset: u64) -> LineReader<R> {
        LineReader {
            reader: BufReader::with_capacity(64 * 1024, reader),
            offset,
        }
    }

    /// Byte offset of the next line.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Reads the next line into `buf` (cleared first); `None` at the end.
    pub fn next_into(&mut self, buf: &mut Vec<u8>) -> std::io::Result<Option<RawLine>> {
        buf.clear();
        // Set once the line passed MAX_LINE: its bytes are hashed as they
        // come and dropped.
        let mut long: Option<(LineHasher, usize)> = None;
        loop {
            let chunk = match self.reader.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                let n = long.map_or(buf.len(), |(_, n)| n);
                return Ok((n > 0).then_some(RawLine::Torn(n)));
            }
            let (piece, end) = match memchr::memchr(b'\n', chunk) {
                Some(i) => (&chunk[..i], true),
                None => (chunk, false),
            };
            match &mut long {
                Some((hasher, n)) => {
                    hasher.update(piece);
                    *n += piece.len();
                }
                None if buf.len() + piece.len() > MAX_LINE => {
                    let mut hasher = LineHasher::new();
                    hasher.update(buf);
                    hasher.update(piece);
                    long = Some((hasher, buf.len() + piece.len()));
                    buf.clear();
                }
                None => buf.extend_from_slice(piece),
            }
            let used = piece.len() + usize::from(end);
            self.reader.consume(used);
            if end {
                return Ok(Some(match long {
                    Some((hasher, len)) => {
                        self.offset += len as u64 + 1;
                        RawLine::Overlong {
                            len,
                            hash: hasher.finish(),
                        }
                    }
                    None => {
                        self.offset += buf.len() as u64 + 1;
                        RawLine::Line
                    }
                }));
            }
        }
    }
}

/// What one complete line told the chain check.
struct Link {
    line: usize,
    seq: Option<u64>,
    /// Its `prev` does not match the line before it.
    broken: bool,
    /// `seq` differs from the expected one (a gap explains a prev mismatch).
    gap: bool,
}

/// What one line says on its own, before the chain is checked: its hash
/// and its parse. Made by [`scan`]'s workers, in any order.
struct Pre {
    hash: String,
    parsed: Result<Line, Unparsed>,
}

/// A line that did not parse: the chain fields it still has, and why.
struct Unparsed {
    seq: Option<u64>,
    prev: Option<String>,
    what: String,
}

impl Pre {
    fn of(raw: &[u8]) -> Pre {
        let mut pre = Pre {
            hash: String::new(),
            parsed: Err(Unparsed {
                seq: None,
                prev: None,
                what: String::new(),
            }),
        };
        pre.parse(raw);
        pre
    }

    /// Hashes and parses `raw` in place of the line this held, reusing its
    /// buffers.
    fn parse(&mut self, raw: &[u8]) {
        line_hash_into(raw, &mut self.hash);
        if raw.is_empty() {
            let what = "empty line".into();
            self.parsed = Err(Unparsed {
                seq: None,
                prev: None,
                what,
            });
            return;
        }
        // Checked as UTF-8 once, so the parser does not check every string
        // again (a third of its time); invalid bytes get the parser's own
        // error and position.
        let text = std::str::from_utf8(raw);
        if let Ok(text) = text {
            // A request line as the writer writes it, into the buffers of
            // the line held before; anything else through serde.
            match &mut self.parsed {
                Ok(line) => {
                    if crate::wire::read_request_into(text, line) {
                        return;
                    }
                }
                Err(_) => {
                    let mut line = Line {
                        v: 0,
                        seq: 0,
                        ts: String::new(),
                        entry: Entry::UdpDropped { packets: 0 },
                        prev: String::new(),
                    };
                    if crate::wire::read_request_into(text, &mut line) {
                        self.parsed = Ok(line);
                        return;
                    }
                }
            }
        }
        let parsed = match text {
            Ok(text) => serde_json::from_str::<Line>(text),
            Err(_) => serde_json::from_slice::<Line>(raw),
        };
        self.parsed = parsed.map_err(|err| {
            // Keep the chain check going with whatever fields exist.
            let value = serde_json::from_slice::<serde_json::Value>(raw).ok();
            let obj = value.as_ref().and_then(|v| v.as_object());
            let seq = obj.and_then(|o| o.get("seq")).and_then(|s| s.as_u64());
            let prev = obj
                .and_then(|o| o.get("prev"))
                .and_then(|p| p.as_str())
                .map(str::to_string);
            let what = match obj.and_then(|o| o.get("kind")).and_then(|k| k.as_str()) {
                None if obj.is_none() => "not a JSON object".to_string(),
                Some(kind) if !KINDS.contains(&kind) => format!("unknown kind `{kind}`"),
                _ => format!("malformed line: {err}"),
            };
            Unparsed { seq, prev, what }
        });
    }
}

/// The chain state of a scan: the expected seq, the last hash, and the
/// last two links, since a broken link is blamed on the line before it or
/// after it (see [`Verifier::judge`]).
struct Verifier {
    out: LedgerRead,
    problem_cap: usize,
    line_no: usize,
    expected_seq: u64,
    /// The last line's seq and hash: the head of the chain.
    head_seq: u64,
    last_hash: String,
    /// The line before `pending`: `(line, seq)`.
    before: Option<(usize, Option<u64>)>,
    /// The newest link, judged once the next one is known.
    pending: Option<Link>,
    /// The pending link was already explained by the one before it.
    skip_pending: bool,
}

impl Verifier {
    fn new(problem_cap: usize) -> Verifier {
        Verifier {
            out: LedgerRead::default(),
            problem_cap,
            line_no: 0,
            expected_seq: 1,
            head_seq: 0,
            last_hash: GENESIS_PREV.to_string(),
            before: None,
            pending: None,
            skip_pending: false,
        }
    }

    fn problem(&mut self, line: usize, seq: Option<u64>, what: String) {
        self.out.problem_count += 1;
        let problems = &mut self.out.problems;
        problems.push(Problem { line, seq, what });
        // Problems arrive at most two lines late: sorting and cutting at
        // twice the cap never drops one that belongs in the first `cap`.
        if problems.len() >= self.problem_cap.saturating_mul(2) {
            problems.sort_by_key(|p| p.line);
            problems.truncate(self.problem_cap);
        }
    }

    /// A line longer than [`MAX_LINE`]: a problem; the chain goes on with
    /// its hash.
    fn overlong(&mut self, hash: &str, len: usize) {
        self.line_no += 1;
        let line = self.line_no;
        self.problem(
            line,
            None,
            format!("line of {len} bytes is longer than the {MAX_LINE}-byte limit"),
        );
        self.link(None, None, hash);
    }

    /// One line, hashed and parsed ([`Pre::of`]): checked against the
    /// chain; the parsed line, if it parsed.
    fn accept<'p>(&mut self, pre: &'p Pre) -> Option<&'p Line> {
        self.line_no += 1;
        let line_no = self.line_no;
        match &pre.parsed {
            Ok(line) => {
                if !READABLE_VERSIONS.contains(&line.v) {
                    self.problem(
                        line_no,
                        Some(line.seq),
                        format!("unsupported version v={}", line.v),
                    );
                }
                self.link(Some(line.seq), Some(&line.prev), &pre.hash);
                Some(line)
            }
            Err(Unparsed { seq, prev, what }) => {
                self.problem(line_no, *seq, what.clone());
                self.link(*seq, prev.as_deref(), &pre.hash);
                None
            }
        }
    }

    fn link(&mut self, seq: Option<u64>, prev: Option<&str>, hash: &str) {
        let line = self.line_no;
        let broken = prev.is_some_and(|p| p != self.last_hash);
        let mut gap = false;
        match seq {
            Some(s) if s != self.expected_seq => {
                gap = true;
                let what = if s > self.expected_seq {
                    format!(
                        "seq gap: expected {}, found {s} ({} line(s) missing)",
                        self.expected_seq,
                        s - self.expected_seq
                    )
                } else {
                    format!(
                        "seq out of order: expected {}, found {s}",
                        self.expected_seq
                    )
                };
                self.problem(line, Some(s), what);
                self.expected_seq = s.saturating_add(1);
            }
            Some(s) => self.expected_seq = s.saturating_add(1),
            None => self.expected_seq = self.expected_seq.saturating_add(1),
        }
        let link = Link {
            line,
            seq,
            broken,
            gap,
        };
        if let Some(cur) = self.pending.take() {
            self.judge(cur, Some(&link));
        }
        self.pending = Some(link);
        self.head_seq = seq.unwrap_or(self.expected_seq - 1);
        // Reuses the buffer: no allocation per line.
        self.last_hash.clear();
        self.last_hash.push_str(hash);
    }

    /// Says which line a broken link is to blame on. An edit to line k
    /// changes its hash, so line k+1's `prev` no longer matches; line k is
    /// named ("altered"). If line k's own `prev` was edited too, both links
    /// break and line k is still the one named. A broken link at a seq gap
    /// is explained by the gap (lines deleted).
    fn judge(&mut self, cur: Link, next: Option<&Link>) {
        let skip = std::mem::take(&mut self.skip_pending);
        if cur.broken && !skip {
            match self.before {
                None => self.problem(
                    cur.line,
                    cur.seq,
                    "prev hash mismatch: first line does not start the chain".into(),
                ),
                Some(_) if cur.gap => self.problem(
                    cur.line,
                    cur.seq,
                    "prev hash mismatch after the seq gap".into(),
                ),
                Some(_) if next.is_some_and(|n| n.broken && !n.gap) => {
                    self.problem(
                        cur.line,
                        cur.seq,
                        "prev hash mismatch (line altered: next line's prev does not match it either)"
                            .into(),
                    );
                    self.skip_pending = true;
                }
                Some((line, seq)) => self.problem(
                    line,
                    seq,
                    format!(
                        "prev hash mismatch (line altered: its hash does not match line {}'s prev)",
                        cur.line
                    ),
                ),
            }
        }
        self.before = Some((cur.line, cur.seq));
    }

    fn finish(mut self, torn: usize) -> LedgerRead {
        if let Some(cur) = self.pending.take() {
            self.judge(cur, None);
        }
        let cap = self.problem_cap;
        let mut out = self.out;
        out.head = (self.head_seq, self.last_hash);
        out.problems.sort_by_key(|p| p.line);
        out.problems.truncate(cap);
        if torn > 0 {
            out.torn_tail = Some(TornTail {
                line: self.line_no + 1,
                bytes: torn,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::RequestLine;
    use crate::hash::line_hash;

    /// A small reader buffer makes lines cross chunk boundaries.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let n = out.len().min(self.0.len()).min(7);
            out[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn an_overlong_line_is_a_problem_and_the_chain_goes_on() {
        let big = "x".repeat(MAX_LINE + 10);
        let l2 = format!(
            r#"{{"v":2,"seq":2,"ts":"t","kind":"udp_dropped","packets":1,"prev":"{}"}}"#,
            line_hash(big.as_bytes())
        );
        let bytes = format!("{big}\n{l2}\n");
        let read = read_bytes(bytes.as_bytes());
        assert_eq!(read.problems.len(), 1, "{:?}", read.problems);
        assert_eq!(read.problems[0].line, 1);
        assert!(read.problems[0].what.contains("longer than"));
        assert_eq!(read.lines.len(), 1);
        assert_eq!(read.head, (2, line_hash(l2.as_bytes())));
        assert_eq!(read.good_len, bytes.len() as u64);
        // A torn overlong tail is counted, not kept.
        let torn = format!("{l2}\n{big}");
        let read = read_bytes(torn.as_bytes());
        assert_eq!(read.torn_tail.map(|t| t.bytes), Some(big.len()));
    }

    #[test]
    fn chunk_boundaries_change_nothing() {
        let l1 = r#"{"v":1,"seq":1,"ts":"t","kind":"udp_dropped","packets":1,"prev":"0000000000000000000000000000000000000000000000000000000000000000"}"#;
        let l2 = format!(
            r#"{{"v":1,"seq":3,"ts":"t","kind":"udp_dropped","packets":2,"prev":"{}"}}"#,
            line_hash(b"other")
        );
        let text = format!("{l1}\n\nnot json\n{l2}\n{{\"torn");
        let whole = read_bytes(text.as_bytes());
        let mut lines = Vec::new();
        let mut trickled = scan(Trickle(text.as_bytes()), usize::MAX, |l, _, _| {
            lines.push(l.clone())
        })
        .unwrap();
        trickled.lines = lines;
        assert_eq!(trickled.problems, whole.problems);
        assert_eq!(trickled.lines, whole.lines);
        assert_eq!(trickled.head, whole.head);
        assert_eq!(trickled.torn_tail, whole.torn_tail);
        assert_eq!(trickled.good_len, whole.good_len);
        assert!(!whole.problems.is_empty());
    }

    /// A chained ledger of `n` small lines, as the writer would make it.
    fn chained(n: u64) -> Vec<String> {
        let mut prev = GENESIS_PREV.to_string();
        (1..=n)
            .map(|seq| {
                let line = format!(
                    r#"{{"v":3,"seq":{seq},"ts":"t","kind":"udp_dropped","packets":{seq},"prev":"{prev}"}}"#
                );
                prev = line_hash(line.as_bytes());
                line
            })
            .collect()
    }

    #[test]
    fn many_batches_are_checked_in_file_order() {
        // Several batches for the workers: an edit, an overlong line and a
        // torn tail far apart must still be found at their own lines.
        let mut lines = chained(3007);
        assert!(lines.len() > 3 * BATCH_LINES, "several batches");
        lines[1500] = lines[1500].replace("\"packets\":1501", "\"packets\":9");
        lines[2500] = "y".repeat(MAX_LINE + 1);
        let text = format!("{}\n{{\"torn", lines.join("\n"));
        let mut seen = Vec::new();
        let read = scan(text.as_bytes(), usize::MAX, |line, hash, offset| {
            seen.push((line.seq, offset, hash.to_string()))
        })
        .unwrap();
        let named: Vec<usize> = read.problems.iter().map(|p| p.line).collect();
        // The overlong line replaced a line, so the next one's prev names it too.
        assert_eq!(named, [1501, 2501, 2501], "{:?}", read.problems);
        assert!(read.problems[1].what.contains("longer than"));
        assert_eq!(
            read.torn_tail.map(|t| (t.line, t.bytes)),
            Some((lines.len() + 1, 6))
        );
        assert_eq!(read.good_len, text.len() as u64 - 6);
        // Every parsed line once, in order, at its own offset, with its hash.
        assert_eq!(seen.len(), lines.len() - 1);
        let mut offset = 0;
        let mut k = 0;
        for (i, line) in lines.iter().enumerate() {
            if i != 2500 {
                assert_eq!(seen[k], (i as u64 + 1, offset, line_hash(line.as_bytes())));
                k += 1;
            }
            offset += line.len() as u64 + 1;
        }
        assert_eq!(
            read.head,
            (
                lines.len() as u64,
                line_hash(lines.last().unwrap().as_bytes())
            )
        );
    }

    #[test]
    fn reused_lines_read_as_fresh_ones() {
        // Request lines (read into the buffers of earlier lines), other
        // kinds, escaped and broken lines in turn over many batches, with
        // fewer headers than the line before: each reads as serde reads it.
        let request = |seq: u64, headers: usize| {
            let line = Line {
                v: 4,
                seq,
                ts: "2026-11-29T07:28:19.123Z".into(),
                entry: Entry::Request(RequestLine {
                    host: "api.example.com".into(),
                    query: seq.is_multiple_of(3).then(|| "a=1".to_string()),
                    http: "HTTP/2".into(),
                    tier: crate::entry::ListenerTier::Transparent,
                    bytes_in: seq,
                    bytes_out: seq.is_multiple_of(2).then_some(seq),
                    duration_ms: 1,
                    upstream: "http://t/".into(),
                    headers: (0..headers)
                        .map(|h| (format!("h{h}"), format!("v{seq}")))
                        .collect(),
                    websocket: seq.is_multiple_of(5),
                    client_gone: seq.is_multiple_of(7),
                    ..RequestLine::test(&format!("s{seq}"), "GET", &format!("/p/{seq}"))
                }),
                prev: GENESIS_PREV.into(),
            };
            serde_json::to_string(&line).unwrap()
        };
        let texts: Vec<String> = (1..=2000u64)
            .map(|seq| match seq % 6 {
                0 => format!(
                    r#"{{"v":3,"seq":{seq},"ts":"t","kind":"udp_dropped","packets":1,"prev":"{GENESIS_PREV}"}}"#
                ),
                1 => request(seq, 0).replace("GET", "G\\u0045T"),
                2 => "not json".into(),
                3 => String::new(),
                _ => request(seq, (seq % 4) as usize),
            })
            .collect();
        let text = texts.join("\n") + "\n";
        let mut seen = Vec::new();
        scan(text.as_bytes(), usize::MAX, |line, _, _| {
            seen.push(line.clone())
        })
        .unwrap();
        let want: Vec<Line> = texts
            .iter()
            .filter_map(|t| serde_json::from_str::<Line>(t).ok())
            .collect();
        assert_eq!(want.len(), 2000 - 334 - 333);
        assert_eq!(seen, want);
    }

    #[test]
    fn a_read_error_mid_file_is_returned() {
        struct Fails(Vec<u8>);
        impl Read for Fails {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                if self.0.is_empty() {
                    return Err(std::io::Error::other("disk gone"));
                }
                let n = out.len().min(self.0.len());
                out[..n].copy_from_slice(&self.0[..n]);
                self.0.drain(..n);
                Ok(n)
            }
        }
        let text = chained(2 * BATCH_LINES as u64).join("\n") + "\n";
        let err = scan(Fails(text.into_bytes()), usize::MAX, |_, _, _| {}).unwrap_err();
        assert_eq!(err.to_string(), "disk gone");
    }

    #[test]
    fn a_capped_scan_keeps_the_first_problems_and_counts_all() {
        let text = "x\n".repeat(50);
        let read = scan(text.as_bytes(), 3, |_, _, _| {}).unwrap();
        assert_eq!(read.problems.len(), 3);
        assert_eq!(read.problems[0].line, 1);
        assert_eq!(
            read.problem_count,
            read_bytes(text.as_bytes()).problems.len()
        );
    }
}
