// Helpers shared by the targets (pulled in with `#[path] mod common;`).

/// Splits `data` into chunks whose sizes come from the data itself: each
/// chunk is preceded by one byte giving its length (0 = the rest). Lets one
/// input describe a stream cut into reads or datagrams at arbitrary places.
#[allow(dead_code)]
pub fn chunks(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some((&n, tail)) = rest.split_first() {
        let n = if n == 0 {
            tail.len()
        } else {
            usize::from(n).min(tail.len())
        };
        out.push(&tail[..n]);
        rest = &tail[n..];
    }
    out
}

/// Like [`chunks`] with a two-byte big-endian length (datagrams up to 64 KiB).
#[allow(dead_code)]
pub fn chunks16(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let n = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        out.push(&rest[2..2 + n]);
        rest = &rest[2 + n..];
    }
    out
}

/// Splits `data` at the first `sep` byte: (before, after).
#[allow(dead_code)]
pub fn split2(data: &[u8], sep: u8) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == sep) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// The nesting depth of a JSON value.
#[allow(dead_code)]
pub fn depth(v: &serde_json::Value) -> usize {
    // Iterative, so measuring a deep value cannot itself overflow.
    let mut max = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            serde_json::Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            serde_json::Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}

/// A 24-character secret with an upper, a lower and a digit, from `seed`:
/// what the redaction targets plant and look for.
#[allow(dead_code)]
pub fn secret(seed: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz23456789";
    let mut s = String::from("Q7q");
    for i in 0..21 {
        let b = seed.get(i).copied().unwrap_or(i as u8);
        s.push(char::from(ALPHABET[usize::from(b) % ALPHABET.len()]));
    }
    s
}
