//! Hashes and hex: the line hash that chains the ledger and names keys, and
//! the hex encoding every digest and signature is written in. Shared by the
//! ledger and the seals, so neither depends on the other for it.

/// Lower-case hex SHA-256 of bytes: a ledger line (without its `\n`), or a
/// raw public key (its `key_id`, the fingerprint a reader pins).
pub fn line_hash(bytes: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    hex(digest.as_ref())
}

/// [`line_hash`] into `out`'s buffer (cleared first): the reader hashes
/// every line, and a fresh string for each was an allocation per line.
pub fn line_hash_into(bytes: &[u8], out: &mut String) {
    const DIGITS: [char; 16] = [
        '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f',
    ];
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes);
    out.clear();
    for b in digest.as_ref() {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 0xf)]);
    }
}

/// [`line_hash`] of a line fed in pieces, for lines too long to hold.
pub struct LineHasher(aws_lc_rs::digest::Context);

impl LineHasher {
    pub fn new() -> LineHasher {
        LineHasher(aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256))
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> String {
        hex(self.0.finish().as_ref())
    }
}

impl Default for LineHasher {
    fn default() -> LineHasher {
        LineHasher::new()
    }
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Sized once: a collected flat_map grows its buffer as it goes.
    let mut digits = vec![0u8; 2 * bytes.len()];
    for (pair, b) in digits.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
    // Every byte is an ASCII digit or letter.
    String::from_utf8(digits).unwrap_or_default()
}

/// Bytes of a hex string (either case); `None` for an odd length or a
/// non-hex digit.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// True for a 64-digit hex string: a SHA-256 in the form the ledger writes.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
        assert_eq!(unhex("00abFF"), Some(vec![0, 0xab, 0xff]));
        assert_eq!(unhex("0g"), None);
        assert_eq!(unhex("abc"), None);
        assert!(is_sha256_hex(&line_hash(b"x")));
        assert!(!is_sha256_hex("abc"));
        let mut h = LineHasher::new();
        h.update(b"ab");
        h.update(b"c");
        assert_eq!(h.finish(), line_hash(b"abc"));
        let mut out = "stale".to_string();
        line_hash_into(b"abc", &mut out);
        assert_eq!(out, line_hash(b"abc"));
    }
}
