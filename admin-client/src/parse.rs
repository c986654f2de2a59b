//! The answer as bytes arrive: a parser that sees bytes, not sockets, so
//! the async and the blocking driver share it. It reads the head (skipping
//! interim `1xx` heads), then the body framed by `Content-Length`,
//! `Transfer-Encoding: chunked` or the end of the connection, and hands on
//! the body's bytes as they come. Everything it holds is bounded: the head
//! at [`MAX_HEAD`], a chunk-size or trailer line at [`MAX_LINE`]; the body
//! is the driver's to bound.

/// The most bytes an answer's head may take.
pub const MAX_HEAD: usize = 64 << 10;
/// The most bytes of one chunk-size or trailer line.
const MAX_LINE: usize = 4 << 10;

/// How the body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// The head is still arriving.
    Head,
    /// This many body bytes are left.
    Length(u64),
    Chunked(Chunk),
    /// The body runs to the end of the connection.
    Close,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunk {
    Size,
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    Trailer,
}

/// One answer being read.
#[derive(Debug)]
pub struct Parser {
    status: Option<u16>,
    /// The head so far, or a chunk-size or trailer line so far.
    line: Vec<u8>,
    framing: Framing,
}

impl Parser {
    pub fn new() -> Parser {
        Parser {
            status: None,
            line: Vec::new(),
            framing: Framing::Head,
        }
    }

    /// The final answer's status, once its head is read.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// True once the body's end was read.
    pub fn done(&self) -> bool {
        self.framing == Framing::Done
    }

    /// Feeds bytes read from the connection; the body's bytes among them
    /// are appended to `out`. Bytes past the answer's end are ignored.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        if self.framing != Framing::Head {
            return self.body(input, out);
        }
        let mut from = self.line.len().saturating_sub(3);
        self.line.extend_from_slice(input);
        loop {
            let Some(end) = find(&self.line[from..], b"\r\n\r\n").map(|at| from + at) else {
                if self.line.len() > MAX_HEAD {
                    return Err(format!("its head is over {MAX_HEAD} bytes"));
                }
                return Ok(());
            };
            let (status, framing) = head(&self.line[..end])?;
            let rest = self.line.split_off(end + 4);
            if (100..200).contains(&status) {
                // An interim answer (`100 Continue`): the real one follows.
                self.line = rest;
                from = 0;
                continue;
            }
            self.line.clear();
            self.status = Some(status);
            self.framing = framing;
            return self.body(&rest, out);
        }
    }

    /// The connection ended: fine only where the body runs to its end.
    pub fn eof(&self) -> Result<(), &'static str> {
        match self.framing {
            Framing::Close | Framing::Done => Ok(()),
            Framing::Head => Err("closed the connection without an answer"),
            _ => Err("closed the connection before the answer's end"),
        }
    }

    fn body(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        while !input.is_empty() {
            match &mut self.framing {
                Framing::Head | Framing::Done => return Ok(()),
                Framing::Close => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                Framing::Length(left) | Framing::Chunked(Chunk::Data(left)) => {
                    let n = input
                        .len()
                        .min(usize::try_from(*left).unwrap_or(usize::MAX));
                    out.extend_from_slice(&input[..n]);
                    *left -= n as u64;
                    input = &input[n..];
                    if *left == 0 {
                        self.framing = match self.framing {
                            Framing::Length(_) => Framing::Done,
                            _ => Framing::Chunked(Chunk::DataEnd),
                        };
                    }
                }
                Framing::Chunked(_) => {
                    let Some(nl) = input.iter().position(|&b| b == b'\n') else {
                        self.line.extend_from_slice(input);
                        return line_fits(&self.line);
                    };
                    self.line.extend_from_slice(&input[..nl]);
                    input = &input[nl + 1..];
                    line_fits(&self.line)?;
                    let line = std::mem::take(&mut self.line);
                    self.framing =
                        chunk_line(self.framing, line.strip_suffix(b"\r").unwrap_or(&line))?;
                }
            }
        }
        Ok(())
    }
}

impl Default for Parser {
    fn default() -> Parser {
        Parser::new()
    }
}

fn line_fits(line: &[u8]) -> Result<(), String> {
    if line.len() > MAX_LINE {
        return Err(format!("a chunk line over {MAX_LINE} bytes"));
    }
    Ok(())
}

/// The state after one whole line of the chunked framing.
fn chunk_line(framing: Framing, line: &[u8]) -> Result<Framing, String> {
    Ok(match framing {
        Framing::Chunked(Chunk::Size) => {
            let digits = line.split(|&b| b == b';').next().unwrap_or_default();
            let digits = String::from_utf8_lossy(digits);
            let size = u64::from_str_radix(digits.trim(), 16)
                .map_err(|_| format!("a bad chunk size {digits:?}"))?;
            match size {
                0 => Framing::Chunked(Chunk::Trailer),
                n => Framing::Chunked(Chunk::Data(n)),
            }
        }
        Framing::Chunked(Chunk::DataEnd) if line.is_empty() => Framing::Chunked(Chunk::Size),
        Framing::Chunked(Chunk::DataEnd) => return Err("a chunk longer than its size".into()),
        Framing::Chunked(Chunk::Trailer) if line.is_empty() => Framing::Done,
        // A trailer field: not needed.
        other => other,
    })
}

/// The status and body framing a head (without its blank line) declares.
pub fn head(head: &[u8]) -> Result<(u16, Framing), String> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let first = lines.next().unwrap_or_default();
    let status = first
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(1..5))
        .and_then(|code| code.strip_prefix(' '))
        .filter(|code| code.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP/1 status line: {:?}", cut(first)))?;
    let mut chunked = false;
    let mut length: Option<u64> = None;
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("a header line without a colon: {:?}", cut(line)))?;
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") {
            let last = value.rsplit(',').next().unwrap_or_default().trim();
            chunked = last.eq_ignore_ascii_case("chunked");
        } else if name.eq_ignore_ascii_case("content-length") {
            let n = value
                .parse::<u64>()
                .map_err(|_| format!("a bad Content-Length {:?}", cut(value)))?;
            if length.is_some_and(|m| m != n) {
                return Err("two different Content-Lengths".into());
            }
            length = Some(n);
        }
    }
    let framing = if (100..200).contains(&status) || status == 204 || status == 304 {
        Framing::Done
    } else if chunked {
        Framing::Chunked(Chunk::Size)
    } else {
        match length {
            Some(0) => Framing::Done,
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    Ok((status, framing))
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The first 80 characters of what a server sent, for an error.
fn cut(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(answer: &[u8], split: usize) -> Result<(u16, Vec<u8>, bool), String> {
        let mut p = Parser::new();
        let mut out = Vec::new();
        p.push(&answer[..split], &mut out)?;
        p.push(&answer[split..], &mut out)?;
        Ok((p.status().unwrap_or(0), out, p.done()))
    }

    #[test]
    fn every_framing_reads_whole_wherever_the_bytes_split() {
        let answers: [(&[u8], &[u8], bool); 4] = [
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello", true),
            (
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;x=1\r\nhel\r\n2\r\nlo\r\n0\r\nT: 1\r\n\r\n",
                b"hello",
                true,
            ),
            (b"HTTP/1.0 200 OK\r\n\r\nhello", b"hello", false),
            (b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n", b"", true),
        ];
        for (answer, body, done) in answers {
            for split in 0..=answer.len() {
                let got = whole(answer, split).unwrap();
                assert_eq!(got, (got.0, body.to_vec(), done), "split at {split}");
                assert!(got.0 == 200 || got.0 == 204);
            }
        }
    }

    #[test]
    fn bad_answers_are_refused() {
        for answer in [
            &b"SSH-2.0-OpenSSH\r\n\r\n"[..],
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
        ] {
            assert!(
                whole(answer, 0).is_err(),
                "{:?}",
                String::from_utf8_lossy(answer)
            );
        }
        let mut p = Parser::new();
        assert!(p.push(&vec![b'a'; MAX_HEAD + 1], &mut Vec::new()).is_err());
        let mut p = Parser::new();
        let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        p.push(head, &mut Vec::new()).unwrap();
        assert!(p.push(&vec![b'1'; MAX_LINE + 1], &mut Vec::new()).is_err());
    }

    #[test]
    fn the_end_of_the_connection_ends_only_an_unframed_body() {
        let mut p = Parser::new();
        assert!(p.eof().is_err());
        p.push(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
            &mut Vec::new(),
        )
        .unwrap();
        assert!(p.eof().is_err());
        let mut p = Parser::new();
        p.push(b"HTTP/1.1 200 OK\r\n\r\nhel", &mut Vec::new())
            .unwrap();
        assert!(p.eof().is_ok());
    }
}
