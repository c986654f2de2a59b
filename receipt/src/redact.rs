//! Redaction: the only gate between observed traffic and the ledger. Every
//! text that is recorded passes through here first, so secrets (credentials
//! in headers, keys and tokens in query strings, well-known key shapes
//! anywhere) never reach the disk. Rules are deliberate and narrow: ordinary
//! vendor object ids (`cus_123`, `ch_…`, `pk_test_…` publishable keys) stay
//! readable, because a receipt nobody can read proves nothing.
//!
//! What is recognised: credential header names; parameter names that mean a
//! secret (`api_key`, `*token*`, `*secret*`, `*assertion*`, `pw`, `otp`,
//! session ids, … — see `secret_param`) in query strings, in path
//! parameters (`;jsessionid=`) and, for the unambiguous ones, in prose
//! (`client_secret=…`); the credential after `Bearer` and after `Basic`
//! (when it is base64 of `user:pass`); URL passwords; and key shapes
//! wherever they stand, names included: Stripe (`sk_`/`rk_` live and test,
//! `whsec_`), GitHub (`ghp_`…, `github_pat_`), Slack (`xox?-`, `xoxe.`,
//! `xapp-`), Google (`ya29.`, `AIza`), SendGrid (`SG.`), AWS access key ids
//! (`AKIA`/`ASIA` + 16), OpenAI and Anthropic keys (`sk-` + 20 mixed-case
//! characters with a digit) and JWTs. Detection reads text percent-decoded
//! once, as the server would (`sk%5Flive%5F…`), and replaces the encoded run.
//! Everything is hand-written byte scanning: bounded, linear, no regex.
//!
//! Every function is idempotent: redacting redacted text changes nothing.

use crate::entry::Entry;
use crate::entry::{
    BlockedLine, CallbackDroppedLine, CallbackLine, CheckLine, PassthroughLine, RequestLine,
    ReservedPathLine, ResponseIncompleteLine, SessionLine, TlsAbandonedLine, TrustFailureLine,
    TunnelCloseLine, UpstreamErrorLine,
};

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Header names whose whole value is a credential.
const SECRET_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "apikey",
    "x-auth-token",
    "x-access-token",
    "x-refresh-token",
    "x-goog-api-key",
    "x-amz-security-token",
    "x-csrf-token",
    "x-xsrf-token",
    "stripe-signature",
    "x-hub-signature",
    "x-hub-signature-256",
    "x-veris-token",
    // GitHub's second factor on basic-auth requests.
    "x-github-otp",
];

/// Fragments that make a header name a credential wherever they appear
/// (`x-custom-api-key`, `x-service-token`, `x-goog-iap-jwt-assertion`). Bare
/// `key` is not one of them: `Idempotency-Key` is an ordinary request id
/// worth keeping.
const SECRET_HEADER_FRAGMENTS: &[&str] = &[
    "token",
    "secret",
    "password",
    "api-key",
    "apikey",
    "api_key",
    "signature",
    "credential",
    "session",
    "assertion",
];

/// Returns the value to record for header `name`: [`REDACTED`] for
/// credential-carrying headers, otherwise the value with [`text`] applied.
pub fn header_value(name: &str, value: &str) -> String {
    if secret_header(name) {
        REDACTED.to_string()
    } else {
        text(value)
    }
}

/// True for a credential-carrying header name, in any case. Lower-cased on
/// the stack: this runs for every recorded header.
fn secret_header(name: &str) -> bool {
    let name = name.trim().as_bytes();
    let mut buf = [0u8; 64];
    let Some(lower) = buf.get_mut(..name.len()) else {
        // A longer name is rare: the allocating way.
        return secret_header_lower(&name.to_ascii_lowercase());
    };
    lower.copy_from_slice(name);
    lower.make_ascii_lowercase();
    secret_header_lower(lower)
}

fn secret_header_lower(name: &[u8]) -> bool {
    SECRET_HEADERS.iter().any(|h| name == h.as_bytes())
        || SECRET_HEADER_FRAGMENTS
            .iter()
            .any(|f| has_part(name, f.as_bytes()))
}

/// True when `part` (non-empty) occurs in `hay`. Both are a few bytes long,
/// so a first-byte check before each compare beats a substring searcher's
/// setup.
fn has_part(hay: &[u8], part: &[u8]) -> bool {
    hay.windows(part.len())
        .any(|w| w[0] == part[0] && w[1..] == part[1..])
}

/// Redacts a query string (without the leading `?`): a parameter whose name
/// looks like a credential becomes `name=[redacted]`; every other value still
/// passes through [`text`], and so does every name, because a name can be a
/// key itself (`?sk_live_…=1` becomes `[redacted]=1`). Order and separators
/// are kept.
pub fn query(q: &str) -> String {
    q.split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) => {
                let secret = secret_param(&decoded(name), &decoded(value), Context::Param);
                let value = if secret { REDACTED.into() } else { text(value) };
                format!("{}={value}", text(name))
            }
            None => text(pair),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// True when [`query`] would return `q` unchanged: no parameter is a secret
/// by name and [`text`] leaves every name and value alone.
fn query_untouched(q: &str) -> bool {
    q.split('&').all(|pair| match pair.split_once('=') {
        Some((name, value)) => {
            untouched(name)
                && untouched(value)
                && !secret_param(&decoded(name), &decoded(value), Context::Param)
        }
        None => untouched(pair),
    })
}

/// The percent-decoded bytes of `s`, borrowed when there is nothing to decode.
fn decoded(s: &str) -> std::borrow::Cow<'_, [u8]> {
    if s.as_bytes().contains(&b'%') {
        std::borrow::Cow::Owned(Decoded::new(s).bytes)
    } else {
        std::borrow::Cow::Borrowed(s.as_bytes())
    }
}

/// Where a `name=value` was found, which decides how much a name must say
/// before its value is taken for a secret.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    /// A query or form parameter, or a path parameter (`;jsessionid=`):
    /// short names such as `key`, `code` and `pw` are secrets here.
    Param,
    /// Anywhere else in free text, where `code=404` is a status: only names
    /// that cannot mean anything but a secret count.
    Prose,
}

/// True when `name=value` carries a credential. Both are percent-decoded
/// bytes; the name is lower-cased and stripped of separators first, so
/// `api_key`, `apiKey`, `api-key` and `api%5Fkey` are one name.
///
/// Chosen by name, with the reason:
/// - `pw`, `pwd`, `pass`, `passwd`, `passcode`, `*password*`,
///   `*passphrase*`: passwords.
/// - `*assertion*` (`client_assertion`, `saml_assertion`): a signed
///   assertion is presented in place of a password (RFC 7521).
/// - `otp`, `totp`: a one-time password is a live second factor until it
///   is used or expires; short, but recorded it is replayable.
/// - `pin` and `refresh` unless the value is a flag (`true`, `1`,
///   `wait_for`): Elasticsearch's `refresh=wait_for` and a pinned item stay
///   readable, a PIN or a refresh token does not.
/// - `session`, `*sessionid*`, `*sessid*` (`jsessionid`, `PHPSESSID`): a
///   session id is a bearer credential.
///
/// Not secrets, so kept: `nonce` (replay protection, echoed back in the id
/// token by design), `state` (CSRF correlation, returned to the client in
/// clear), and any name ending in `type` or `typehint`
/// (`client_assertion_type`, `token_type_hint`): they say which kind of
/// credential, not which one. Their values are still scanned by [`text`].
/// Parts of a (normalized) name that mean a secret wherever they stand.
const SECRET_NAME_PARTS: &[&str] = &[
    "token",
    "secret",
    "password",
    "passphrase",
    "apikey",
    "signature",
    "credential",
    "accesskey",
    "privatekey",
    "assertion",
    "sessionid",
    "sessid",
    "cookie",
    // One-time codes with a name that says so (`verification_code`,
    // `mfa_code`); bare `code` is exact-only below (`country_code` stays).
    "verificationcode",
    "mfacode",
    "otpcode",
    "smscode",
    "authcode",
    // Card data (`card[number]`, `card[cvc]`, `payment_method_data[card][cvv]`)
    // and bank account numbers (`bank_account[account_number]`).
    "cardnumber",
    "cvc",
    "cvv",
    "accountnumber",
];

fn secret_param(name: &[u8], value: &[u8], context: Context) -> bool {
    // The name's letters and digits, lower-cased: on the stack for any name
    // a parameter has in practice (this runs for every recorded parameter).
    let mut buf = [0u8; 64];
    let long: Vec<u8>;
    let alnum = name.iter().filter(|c| c.is_ascii_alphanumeric());
    let norm: &[u8] = if alnum.clone().count() <= buf.len() {
        let mut n = 0;
        for (slot, c) in buf.iter_mut().zip(alnum) {
            *slot = c.to_ascii_lowercase();
            n += 1;
        }
        &buf[..n]
    } else {
        long = alnum.map(|c| c.to_ascii_lowercase()).collect();
        &long
    };
    let is = |word: &&str| word.as_bytes() == norm;
    if norm.ends_with(b"type") || norm.ends_with(b"typehint") {
        return false;
    }
    if SECRET_NAME_PARTS
        .iter()
        .any(|f| has_part(norm, f.as_bytes()))
    {
        return true;
    }
    if context == Context::Prose {
        return false;
    }
    if card_number(value) {
        return true;
    }
    const EXACT: &[&str] = &[
        "key",
        "auth",
        "authorization",
        "code",
        "codeverifier",
        "sig",
        "jwt",
        "pass",
        "passwd",
        "pwd",
        "pw",
        "passcode",
        "otp",
        "totp",
        "session",
        "sid",
    ];
    const UNLESS_FLAG: &[&str] = &["pin", "refresh"];
    const FLAGS: &[&str] = &[
        "true", "false", "1", "0", "yes", "no", "on", "off", "wait_for",
    ];
    EXACT.iter().any(is)
        || (UNLESS_FLAG.iter().any(is)
            && !FLAGS.iter().any(|f| value.eq_ignore_ascii_case(f.as_bytes())))
        // `x-goog-api-key`, `subscription-key`, `access_key`: a name ending
        // in "key" is a key in a query string often enough to err this way.
        || norm.ends_with(b"key")
}

/// True for a payment card number: 12 to 19 digits (spaces and dashes
/// between groups allowed) that pass the Luhn check. Applied to every
/// parameter value whatever its name (`number=`, `pan=`, `cc=`): a
/// numeric id passes only when its check digit happens to fit, and then
/// the receipt says less, never something false.
fn card_number(value: &[u8]) -> bool {
    let mut digits = 0;
    let mut sum = 0;
    // `+` is a space in a form or query value.
    for &c in value
        .iter()
        .rev()
        .filter(|c| !matches!(c, b' ' | b'-' | b'+'))
    {
        if !c.is_ascii_digit() || digits == 19 {
            return false;
        }
        let d = u32::from(c - b'0');
        sum += match (digits % 2, d * 2) {
            (0, _) => d,
            (_, x) if x > 9 => x - 9,
            (_, x) => x,
        };
        digits += 1;
    }
    digits >= 12 && sum % 10 == 0
}

/// Longer than any flag value of [`secret_param`]: a value cut to this
/// length is a flag only if the whole value is.
const FLAG_SCAN: usize = 10;

/// Text as a server reads it after one round of percent-decoding, with the
/// offset in the original of every decoded byte: detection runs on the
/// decoded bytes, redaction replaces the original (encoded) run.
struct Decoded<'a> {
    src: &'a str,
    bytes: Vec<u8>,
    /// `at[k]` is where `bytes[k]` starts in `src`; `at[bytes.len()]` is
    /// `src.len()`.
    at: Vec<usize>,
}

impl<'a> Decoded<'a> {
    fn new(src: &'a str) -> Self {
        let b = src.as_bytes();
        let mut bytes = Vec::with_capacity(b.len());
        let mut at = Vec::with_capacity(b.len() + 1);
        let mut i = 0;
        while i < b.len() {
            at.push(i);
            let hex = |k: usize| b.get(k).and_then(|&c| char::from(c).to_digit(16));
            match (b[i], hex(i + 1), hex(i + 2)) {
                (b'%', Some(hi), Some(lo)) => {
                    // Two hex digits: the value is below 256.
                    bytes.push((hi * 16 + lo) as u8);
                    i += 3;
                }
                (c, _, _) => {
                    bytes.push(c);
                    i += 1;
                }
            }
        }
        at.push(b.len());
        Self { src, bytes, at }
    }

    /// The original with each decoded span `(start, end)` replaced by
    /// [`REDACTED`]. Spans come in order and do not overlap.
    fn replace(&self, spans: &[(usize, usize)]) -> String {
        if spans.is_empty() {
            return self.src.to_string();
        }
        let src = self.src.as_bytes();
        let mut out = Vec::with_capacity(src.len());
        let mut copied = 0;
        for &(start, end) in spans {
            let (start, end) = (self.at[start].max(copied), self.at[end].max(copied));
            out.extend_from_slice(&src[copied..start]);
            out.extend_from_slice(REDACTED.as_bytes());
            copied = end;
        }
        out.extend_from_slice(&src[copied..]);
        // Spans start and end next to ASCII bytes, so the cut never splits a
        // character; should one ever, a replacement character beats a panic.
        String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }
}

/// Runs one scanner over the decoded view of `s` and redacts what it finds.
fn redact_with(s: &str, find: fn(&[u8]) -> Vec<(usize, usize)>) -> String {
    let decoded = Decoded::new(s);
    let spans = find(&decoded.bytes);
    decoded.replace(&spans)
}

/// What may follow a key prefix.
#[derive(Clone, Copy)]
enum Body {
    /// At least `min` token bytes (letters, digits, `_`, `-`, `.`).
    Token,
    /// Exactly `min` upper-case letters and digits (AWS key ids).
    Upper,
    /// At least `min` letters, digits, `_` and `-`, with an upper-case
    /// letter, a lower-case letter and a digit among them: random, unlike
    /// host names (`sk-prod-cluster…`) and slugs (`sk-learn-…`).
    Random,
}

/// Known secret shapes: (prefix, minimum body length, body). A match needs a
/// token boundary before the prefix (start of text or a non-alphanumeric
/// byte), so `task_live_…` is not taken for `sk_live_…`, and none after it.
const SECRET_PREFIXES: &[(&str, usize, Body)] = &[
    // Stripe secret and restricted keys, webhook signing secrets.
    ("sk_live_", 6, Body::Token),
    ("sk_test_", 6, Body::Token),
    ("rk_live_", 6, Body::Token),
    ("rk_test_", 6, Body::Token),
    ("whsec_", 6, Body::Token),
    // GitHub tokens.
    ("ghp_", 20, Body::Token),
    ("gho_", 20, Body::Token),
    ("ghu_", 20, Body::Token),
    ("ghs_", 20, Body::Token),
    ("ghr_", 20, Body::Token),
    ("github_pat_", 20, Body::Token),
    // Slack tokens: bot, user, app, refresh, session, rotating, app-level.
    ("xoxb-", 10, Body::Token),
    ("xoxp-", 10, Body::Token),
    ("xoxa-", 10, Body::Token),
    ("xoxr-", 10, Body::Token),
    ("xoxs-", 10, Body::Token),
    ("xoxe.", 10, Body::Token),
    ("xoxe-", 10, Body::Token),
    ("xapp-", 10, Body::Token),
    // Google OAuth access tokens and API keys.
    ("ya29.", 20, Body::Token),
    ("AIza", 30, Body::Token),
    // SendGrid API keys.
    ("SG.", 20, Body::Token),
    // AWS access key ids: long-term and temporary (STS).
    ("AKIA", 16, Body::Upper),
    ("ASIA", 16, Body::Upper),
    // OpenAI (`sk-…`, `sk-proj-…`) and Anthropic (`sk-ant-…`) API keys.
    ("sk-", 20, Body::Random),
];

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.'
}

fn is_base64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Token bytes of an HTTP credential (RFC 7235 `token68`, leniently).
fn is_token68(b: u8) -> bool {
    is_token_byte(b) || matches!(b, b'~' | b'+' | b'/' | b'=')
}

/// True at a token boundary: the start of text or after a non-alphanumeric.
fn boundary(b: &[u8], i: usize) -> bool {
    i == 0 || !b[i - 1].is_ascii_alphanumeric()
}

/// Redacts secrets found anywhere in free text: the key shapes listed in
/// the module doc become [`REDACTED`]; `Bearer <token>` becomes
/// `Bearer [redacted]` and so does `Basic <base64 of user:pass>`; a secret
/// `name=value` becomes `name=[redacted]`; a password in a URL
/// (`https://u:p@host`) becomes `https://u:[redacted]@host`.
pub fn text(s: &str) -> String {
    if untouched(s) {
        return s.to_string();
    }
    every_scanner(s)
}

/// [`text`] of an owned field: the field itself, not a copy, when nothing in
/// it is redacted (nearly always).
fn owned(s: String) -> String {
    if untouched(&s) {
        s
    } else {
        every_scanner(&s)
    }
}

/// [`url`] of an owned field, the field itself when nothing is redacted.
fn owned_url(s: String) -> String {
    let unchanged = match s.split_once('?') {
        Some((base, q)) => untouched(base) && query_untouched(q),
        None => untouched(&s),
    };
    if unchanged {
        s
    } else {
        url(&s)
    }
}

fn every_scanner(s: &str) -> String {
    let s = redact_with(s, key_shapes);
    let s = redact_with(&s, jwts);
    let s = redact_with(&s, auth_schemes);
    let s = redact_with(&s, assignments);
    redact_userinfo(&s)
}

/// True when [`text`] would return `s` unchanged: every scanner finds
/// nothing in one decoded view and there is no `user:pass@` to cut. Each
/// step of `text` is the identity when its scanner finds nothing, so this
/// is the same answer for the common case (a host, a method, a clean path)
/// at the cost of one scan and no copies.
fn untouched(s: &str) -> bool {
    quiet(s.as_bytes()) || scanners_find_nothing(s)
}

/// True when no scanner can start anywhere in `b`: one pass over the bytes
/// that checks, at each byte that could begin a match, the condition every
/// scanner needs there (a key prefix's first two bytes at a token boundary,
/// `eyJ` at a boundary, `bearer`/`basic` at a boundary, any `=`). A `%`
/// (the decoded view may differ) or an `@` (a URL's `user:pass@`) leaves
/// the answer to the scanners themselves. A screen, never a verdict: when
/// it says false, [`scanners_find_nothing`] decides.
fn quiet(b: &[u8]) -> bool {
    for (i, &c) in b.iter().enumerate() {
        let trigger = match TRIGGERS[usize::from(c)] {
            Trigger::None => false,
            Trigger::Always => true,
            Trigger::AtBoundary => {
                boundary(b, i)
                    && ((KEY_STARTS[usize::from(c)]
                        && b.get(i + 1).is_some_and(|&d| key_pair(c, d)))
                        || b[i..].starts_with(b"eyJ")
                        || starts_with_ignore_case(&b[i..], b"bearer")
                        || starts_with_ignore_case(&b[i..], b"basic"))
            }
        };
        if trigger {
            return false;
        }
    }
    true
}

fn starts_with_ignore_case(b: &[u8], word: &[u8]) -> bool {
    b.get(..word.len())
        .is_some_and(|h| h.eq_ignore_ascii_case(word))
}

/// What a byte means to [`quiet`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Trigger {
    None,
    /// `%`, `=`, `@`: the scanners decide.
    Always,
    /// May begin a key shape, a JWT or an auth scheme at a token boundary.
    AtBoundary,
}

const TRIGGERS: [Trigger; 256] = {
    let mut t = [Trigger::None; 256];
    let mut k = 0;
    while k < SECRET_PREFIXES.len() {
        t[SECRET_PREFIXES[k].0.as_bytes()[0] as usize] = Trigger::AtBoundary;
        k += 1;
    }
    t[b'e' as usize] = Trigger::AtBoundary;
    t[b'b' as usize] = Trigger::AtBoundary;
    t[b'B' as usize] = Trigger::AtBoundary;
    t[b'%' as usize] = Trigger::Always;
    t[b'=' as usize] = Trigger::Always;
    t[b'@' as usize] = Trigger::Always;
    t
};

/// The exact answer of [`untouched`]: every scanner run over one decoded view.
fn scanners_find_nothing(s: &str) -> bool {
    let decoded;
    let b = if s.as_bytes().contains(&b'%') {
        decoded = Decoded::new(s);
        &decoded.bytes[..]
    } else {
        s.as_bytes()
    };
    key_shapes(b).is_empty()
        && jwts(b).is_empty()
        && auth_schemes(b).is_empty()
        && assignments(b).is_empty()
        && !(s.contains('@') && s.contains("://"))
}

/// The first bytes of [`SECRET_PREFIXES`]: most positions start none of
/// them, and are passed over without trying each prefix.
const KEY_STARTS: [bool; 256] = {
    let mut starts = [false; 256];
    let mut k = 0;
    while k < SECRET_PREFIXES.len() {
        starts[SECRET_PREFIXES[k].0.as_bytes()[0] as usize] = true;
        k += 1;
    }
    starts
};

/// The first two bytes of [`SECRET_PREFIXES`] (every prefix has at least
/// two), one bit per byte pair: a word that starts like one (`s` of
/// `stripe`) but goes on unlike any (`st`) is passed over too.
const KEY_PAIRS: [u64; 1024] = {
    let mut pairs = [0u64; 1024];
    let mut k = 0;
    while k < SECRET_PREFIXES.len() {
        let p = SECRET_PREFIXES[k].0.as_bytes();
        let at = (p[0] as usize) << 8 | p[1] as usize;
        pairs[at >> 6] |= 1 << (at & 63);
        k += 1;
    }
    pairs
};

fn key_pair(first: u8, second: u8) -> bool {
    let at = usize::from(first) << 8 | usize::from(second);
    KEY_PAIRS[at >> 6] >> (at & 63) & 1 == 1
}

fn key_shapes(b: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    // Per shape, the first position where it may match again after a miss.
    let mut retry = [0usize; SECRET_PREFIXES.len()];
    let mut i = 0;
    while i < b.len() {
        let mut hit = None;
        let c = b[i];
        if KEY_STARTS[usize::from(c)]
            && b.get(i + 1).is_some_and(|&d| key_pair(c, d))
            && boundary(b, i)
        {
            for (k, &(prefix, min, body)) in SECRET_PREFIXES.iter().enumerate() {
                // Most shapes start with another byte: one compare each.
                if prefix.as_bytes()[0] != c || i < retry[k] {
                    continue;
                }
                match shape_end(b, i, prefix, min, body) {
                    Ok(end) => {
                        hit = Some(end);
                        break;
                    }
                    Err(until) => retry[k] = until,
                }
            }
        }
        match hit {
            Some(end) => {
                spans.push((i, end));
                i = end;
            }
            None => i += 1,
        }
    }
    spans
}

/// Where a key of this shape starting at `i` ends, or on a miss, the first
/// position where the shape may match again. Work is bounded by the body on
/// a match (which the caller skips), by `min` on a miss of a token or
/// upper-case body, and by the run on a miss of a random body: a later
/// start inside that run sees a shorter, no more mixed run, so the whole
/// run is skipped.
fn shape_end(b: &[u8], i: usize, prefix: &str, min: usize, body: Body) -> Result<usize, usize> {
    // Compared in place: a prefix is a few bytes, a memcmp call costs more.
    let p = prefix.as_bytes();
    if b.len() - i < p.len() || !b[i..i + p.len()].iter().zip(p).all(|(x, y)| x == y) {
        return Err(i + 1);
    }
    let start = i + prefix.len();
    let rest = &b[start..];
    let len = match body {
        Body::Token => rest.iter().take_while(|&&c| is_token_byte(c)).count(),
        Body::Upper => rest
            .iter()
            .take(min + 1)
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
            .count(),
        Body::Random => {
            let n = rest.iter().take_while(|&&c| is_base64url(c)).count();
            let run = &rest[..n];
            let mixed = run.iter().any(u8::is_ascii_uppercase)
                && run.iter().any(u8::is_ascii_lowercase)
                && run.iter().any(u8::is_ascii_digit);
            if !mixed || n < min {
                return Err(start + n);
            }
            n
        }
    };
    let end = start + len;
    let exact = matches!(body, Body::Upper);
    let ends_cleanly = b.get(end).is_none_or(|c| !c.is_ascii_alphanumeric());
    if len >= min && (!exact || len == min) && ends_cleanly {
        Ok(end)
    } else {
        Err(i + 1)
    }
}

/// JWTs (and JWEs): `eyJ` (base64 of `{"`) starting a header of at least 10
/// base64url characters, a payload of at least 10, then a signature, which
/// may be empty (`alg: none` is still a bearer token to a lax server), and
/// for a JWE two more parts.
fn jwts(b: &[u8]) -> Vec<(usize, usize)> {
    let run = |from: usize| from + b[from..].iter().take_while(|&&c| is_base64url(c)).count();
    let mut spans = Vec::new();
    let mut i = 0;
    // A failed header run fails for every later `eyJ` inside it too (same
    // payload and signature after it), so it is not scanned again.
    let mut skip_until = 0;
    while i < b.len() {
        if i < skip_until || !boundary(b, i) || !b[i..].starts_with(b"eyJ") {
            // Only an `eyJ` can start one: jump to the next.
            let from = (i + 1).max(skip_until).min(b.len());
            match memchr::memmem::find(&b[from..], b"eyJ") {
                Some(k) => i = from + k,
                None => break,
            }
            continue;
        }
        let header_end = run(i);
        let payload_end = (b.get(header_end) == Some(&b'.')).then(|| run(header_end + 1));
        let found = payload_end
            .filter(|&p| header_end - i >= 10 && p - header_end > 10 && b.get(p) == Some(&b'.'))
            .map(|p| {
                let mut end = run(p + 1);
                // JWE: encrypted key, iv, ciphertext, tag; only non-empty
                // parts extend the match, so a sentence's full stop does not.
                while b.get(end) == Some(&b'.') && run(end + 1) > end + 1 {
                    end = run(end + 1);
                }
                end
            });
        match found {
            Some(end) => {
                spans.push((i, end));
                i = end;
            }
            None => {
                skip_until = header_end;
                i += 1;
            }
        }
    }
    spans
}

/// The credential after `Bearer` (any token) or `Basic` (base64 of
/// `user:pass`, so that "basic auth failed" stays prose), separated by
/// spaces or, in a query value, `+`.
fn auth_schemes(b: &[u8]) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let scheme = [&b"bearer"[..], b"basic"].into_iter().find(|w| {
            boundary(b, i)
                && b[i..]
                    .get(..w.len())
                    .is_some_and(|h| h.eq_ignore_ascii_case(w))
        });
        let Some(word) = scheme else {
            // Only a `b` or `B` can start a scheme: jump to the next.
            match memchr::memchr2(b'b', b'B', &b[i + 1..]) {
                Some(k) => i += 1 + k,
                None => break,
            }
            continue;
        };
        let after = i + word.len();
        let tok = after
            + b[after..]
                .iter()
                .take_while(|&&c| c == b' ' || c == b'+')
                .count();
        // A miss reads no more than `BASIC_SCAN` bytes, so a long run of
        // `basic+basic+…` stays linear; a hit is skipped whole.
        let token_len = |cap: usize| {
            b[tok..]
                .iter()
                .take(cap)
                .take_while(|&&c| is_token68(c))
                .count()
        };
        let head = tok + token_len(BASIC_SCAN);
        let credential =
            tok > after && head > tok && (word == b"bearer" || basic_credential(&b[tok..head]));
        if credential {
            let end = tok + token_len(usize::MAX);
            spans.push((tok, end));
            i = end;
        } else {
            i = after;
        }
    }
    spans
}

/// How much of a `Basic` credential is read for the `:` of `user:pass`:
/// the base64 of a 300-byte user name.
const BASIC_SCAN: usize = 400;

/// True when `s` is base64 whose decoding holds a `:`, as `user:pass` does.
fn basic_credential(s: &[u8]) -> bool {
    let mut acc: u32 = 0;
    let mut bits = 0;
    for &c in s.iter().take_while(|&&c| c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return false,
        };
        acc = (acc << 6 | u32::from(v)) & 0xfff;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            if (acc >> bits) & 0xff == u32::from(b':') {
                return true;
            }
        }
    }
    false
}

/// Bytes that end a value in `name=value`. `[` is one, so `[redacted]` is
/// never a value and redaction is idempotent.
fn ends_value(c: u8) -> bool {
    c.is_ascii_whitespace()
        || c.is_ascii_control()
        || matches!(
            c,
            b'&' | b';'
                | b','
                | b'"'
                | b'\''
                | b'<'
                | b'>'
                | b'('
                | b')'
                | b'['
                | b']'
                | b'{'
                | b'}'
                | b'\\'
                | b'|'
                | b'`'
                | b'#'
                | b'?'
        )
}

/// `name=value` in free text whose name says it is a secret. After `;`, `?`
/// or `&` (path and query parameters, `; token=` in a header) every
/// parameter name of [`secret_param`] counts, and a path parameter's value
/// ends at `/`; elsewhere only the unambiguous names do.
fn assignments(b: &[u8]) -> Vec<(usize, usize)> {
    // Every span follows an `=`.
    if memchr::memchr(b'=', b).is_none() {
        return Vec::new();
    }
    let is_name_byte = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.');
    let mut spans = Vec::new();
    let mut name_start = 0;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if is_name_byte(c) {
            i += 1;
            continue;
        }
        if c == b'=' && name_start < i {
            let before = b[..name_start].iter().rev().find(|&&c| c != b' ');
            let context = match before {
                Some(b';' | b'?' | b'&') => Context::Param,
                _ => Context::Prose,
            };
            // A path parameter's value ends with its segment.
            let path_param = before == Some(&b';');
            let ends = |c: u8| ends_value(c) || (path_param && c == b'/');
            let value = i + 1;
            let value_len = |cap: usize| {
                b[value..]
                    .iter()
                    .take(cap)
                    .take_while(|&&c| !ends(c))
                    .count()
            };
            // The name decides; the value's first bytes only tell a flag
            // (`pin=true`) from a secret. The whole value is measured only
            // when it is redacted and skipped, so `a=a=a=…` stays linear.
            let head = value_len(FLAG_SCAN);
            if head > 0 && secret_param(&b[name_start..i], &b[value..value + head], context) {
                let end = value + value_len(usize::MAX);
                spans.push((value, end));
                i = end;
                name_start = end;
                continue;
            }
        }
        i += 1;
        name_start = i;
    }
    spans
}

fn redact_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        // The authority ends at the first '/', '?', '#' or whitespace.
        let auth_end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..auth_end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                match userinfo.split_once(':') {
                    Some((user, pass)) if pass != REDACTED => {
                        out.push_str(user);
                        out.push(':');
                        out.push_str(REDACTED);
                    }
                    _ => out.push_str(userinfo),
                }
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &tail[auth_end..];
    }
    out.push_str(rest);
    out
}

/// Applies the rules above to every recorded text field of an entry. The
/// ledger's writer calls this on every entry it is given: it is the one
/// place where redaction happens, so the proxy hands over what it saw.
pub fn entry(entry: Entry) -> Entry {
    match entry {
        Entry::Session(SessionLine {
            mut run_id,
            mut sandbox_id,
            mut twin,
            mut version,
            mut listen,
            mode,
            tier,
            pid,
            recovered_torn_tail,
            key_id,
            public_key,
            key_storage,
            proxy_uid,
            workload_uid,
            twin_heads,
            mut moved_aside,
            coverage,
        }) => {
            if let Some(aside) = moved_aside.as_mut() {
                aside.file = owned(std::mem::take(&mut aside.file));
                aside.why = owned(std::mem::take(&mut aside.why));
            }
            for field in [
                &mut run_id,
                &mut sandbox_id,
                &mut twin,
                &mut version,
                &mut listen,
            ] {
                *field = owned(std::mem::take(field));
            }
            Entry::Session(SessionLine {
                run_id,
                sandbox_id,
                mode,
                tier,
                twin,
                pid,
                version,
                listen,
                recovered_torn_tail,
                key_id,
                public_key,
                key_storage,
                proxy_uid,
                workload_uid,
                twin_heads,
                moved_aside,
                coverage,
            })
        }
        Entry::Request(RequestLine {
            service,
            host,
            method,
            path,
            query: q,
            status,
            http,
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            duration_us,
            upstream,
            headers,
            websocket,
            client_gone,
        }) => Entry::Request(RequestLine {
            service: owned(service),
            host: owned(host),
            method: owned(method),
            path: owned_url(path),
            query: q.map(|q| if query_untouched(&q) { q } else { query(&q) }),
            status,
            http: owned(http),
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            duration_us,
            upstream: owned_url(upstream),
            headers: headers
                .into_iter()
                .map(|(n, v)| {
                    // A header name can be a key itself; judge the value
                    // by the name as sent.
                    let v = if secret_header(&n) {
                        REDACTED.to_string()
                    } else {
                        owned(v)
                    };
                    (owned(n), v)
                })
                .collect(),
            websocket,
            client_gone,
        }),
        Entry::ReservedPath(ReservedPathLine {
            service,
            host,
            method,
            path,
            status,
            error,
            tier,
        }) => Entry::ReservedPath(ReservedPathLine {
            service: owned(service),
            host: owned(host),
            method: owned(method),
            path: owned_url(path),
            status,
            error: owned(error),
            tier,
        }),
        Entry::Callback(CallbackLine {
            service,
            event,
            event_id,
            target,
            method,
            path,
            query: q,
            status,
            error,
            duration_ms,
            duration_us,
            attempt,
            origin,
            fault,
            tls,
        }) => Entry::Callback(CallbackLine {
            service: owned(service),
            event: owned(event),
            event_id: owned(event_id),
            target: owned(target),
            method: owned(method),
            path: owned_url(path),
            query: q.map(|q| if query_untouched(&q) { q } else { query(&q) }),
            status,
            error: error.map(owned),
            duration_ms,
            duration_us,
            attempt,
            origin: owned(origin),
            fault: fault.map(owned),
            tls,
        }),
        Entry::CallbackDropped(CallbackDroppedLine {
            service,
            events,
            reason,
        }) => Entry::CallbackDropped(CallbackDroppedLine {
            service: owned(service),
            events,
            reason: owned(reason),
        }),
        Entry::Tamper { what, detail } => Entry::Tamper {
            what: owned(what),
            detail: owned(detail),
        },
        Entry::Check(CheckLine {
            name,
            status,
            detail,
            since_seq,
            until_seq,
        }) => Entry::Check(CheckLine {
            name: owned(name),
            status: owned(status),
            detail: owned(detail),
            since_seq,
            until_seq,
        }),
        Entry::Passthrough(PassthroughLine {
            host,
            port,
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            reason,
            dst,
        }) => Entry::Passthrough(PassthroughLine {
            host: owned(host),
            port,
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            reason: owned(reason),
            dst: dst.map(owned),
        }),
        Entry::Blocked(BlockedLine {
            host,
            port,
            tier,
            method,
            path,
            reason,
            dst,
        }) => Entry::Blocked(BlockedLine {
            host: owned(host),
            port,
            tier,
            method: method.map(owned),
            path: path.map(owned_url),
            reason: owned(reason),
            dst: dst.map(owned),
        }),
        Entry::UpstreamError(UpstreamErrorLine {
            service,
            host,
            method,
            path,
            upstream,
            status,
            error,
            tier,
            duration_ms,
            bytes_in,
            declared_in,
        }) => Entry::UpstreamError(UpstreamErrorLine {
            service: owned(service),
            host: owned(host),
            method: owned(method),
            path: owned_url(path),
            upstream: owned_url(upstream),
            status,
            error: owned(error),
            tier,
            duration_ms,
            bytes_in,
            declared_in,
        }),
        Entry::TrustFailure(TrustFailureLine {
            host,
            port,
            tier,
            service,
            alert,
        }) => Entry::TrustFailure(TrustFailureLine {
            host: owned(host),
            port,
            tier,
            service: service.map(owned),
            alert: owned(alert),
        }),
        Entry::Quic {
            host,
            dst,
            attempts,
        } => Entry::Quic {
            host: host.map(owned),
            dst: owned(dst),
            attempts,
        },
        Entry::Ech {
            host,
            port,
            tier,
            dst,
        } => Entry::Ech {
            host: owned(host),
            port,
            tier,
            dst: dst.map(owned),
        },
        Entry::RedirectChange { detail } => Entry::RedirectChange {
            detail: owned(detail),
        },
        drops @ Entry::UdpDropped { .. } => drops,
        Entry::Dns {
            name,
            qtype,
            refused,
        } => Entry::Dns {
            name: owned(name),
            qtype,
            refused,
        },
        Entry::TunnelClose(TunnelCloseLine {
            of,
            bytes_in,
            bytes_out,
            duration_ms,
            error,
        }) => Entry::TunnelClose(TunnelCloseLine {
            of,
            bytes_in,
            bytes_out,
            duration_ms,
            error: error.map(owned),
        }),
        Entry::ResponseIncomplete(ResponseIncompleteLine {
            of,
            service,
            bytes,
            declared,
            reason,
        }) => Entry::ResponseIncomplete(ResponseIncompleteLine {
            of,
            service: owned(service),
            bytes,
            declared,
            reason: owned(reason),
        }),
        Entry::BodyCapture {
            of,
            request,
            response,
        } => Entry::BodyCapture {
            of,
            request: captured(request),
            response: captured(response),
        },
        Entry::TlsAbandoned(TlsAbandonedLine {
            host,
            port,
            tier,
            service,
            stage,
            alert,
            alpn,
        }) => Entry::TlsAbandoned(TlsAbandonedLine {
            host: owned(host),
            port,
            tier,
            service: service.map(owned),
            stage: owned(stage),
            alert: alert.map(owned),
            alpn: alpn.map(owned),
        }),
        // Hex digests and a fixed vocabulary: nothing to redact, and
        // rewriting a signature would break it.
        seal @ Entry::Seal { .. } => seal,
    }
}

/// What a captured body may be stored as: its redacted text, or why it is
/// not stored at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyText {
    /// The redacted text, to be stored.
    Text(String),
    /// Not text (binary, compressed, or not UTF-8, or of a type that is
    /// neither JSON, a form nor `text/*`): never stored, only its size.
    Binary,
    /// Text with no structure redaction can follow (`text/*`, XML,
    /// JavaScript): never stored. The free-text scanner knows key shapes
    /// and `name=value`, not `<password>…</password>` or `password: …`, so
    /// storing it could keep a secret.
    Unstructured,
}

/// Redacts a captured body by its `Content-Type`:
/// - JSON (`application/json`, `*+json`): parsed; the value of every key
///   that names a secret (the names [`query`] redacts: `password`,
///   `*token*`, `api_key`, `authorization`, `cvc`, …) becomes
///   [`REDACTED`], and so does any value that is a payment card number;
///   every other string (keys too) goes through [`text`]. A body that does
///   not parse (cut at the cap) is scanned leniently the same way, string
///   by string;
/// - `application/x-www-form-urlencoded`: [`query`];
/// - other `text/*`, XML and JavaScript: [`BodyText::Unstructured`], not
///   stored (see there);
/// - anything else, and bytes that are not UTF-8: [`BodyText::Binary`].
///
/// `truncated` says the bytes were cut at a cap: the last, possibly partial
/// token (half a key is still part of a key) and a split character are
/// dropped before redaction.
pub fn body(content_type: Option<&str>, bytes: &[u8], truncated: bool) -> BodyText {
    let essence = content_type
        .and_then(|c| c.split(';').next())
        .map(|c| c.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let kind =
        if essence == "application/json" || essence.ends_with("+json") || essence == "text/json" {
            BodyKind::Json
        } else if essence == "application/x-www-form-urlencoded" {
            BodyKind::Form
        } else if essence.starts_with("text/")
            || essence == "application/xml"
            || essence.ends_with("+xml")
            || essence == "application/javascript"
        {
            return BodyText::Unstructured;
        } else {
            return BodyText::Binary;
        };
    // Another charset (UTF-16 JSON is valid UTF-8 with NULs between the
    // letters, and hides every name from the scanners): not text to us.
    let charset = content_type
        .and_then(|c| {
            c.split(';')
                .skip(1)
                .find_map(|p| p.trim().strip_prefix("charset="))
        })
        .map(|c| c.trim_matches('"').to_ascii_lowercase());
    if charset.is_some_and(|c| !matches!(c.as_str(), "utf-8" | "utf8" | "us-ascii"))
        || bytes.contains(&0)
    {
        return BodyText::Binary;
    }
    let bytes = if truncated { cut_clean(bytes) } else { bytes };
    let Ok(s) = std::str::from_utf8(bytes) else {
        return BodyText::Binary;
    };
    BodyText::Text(match kind {
        BodyKind::Json => match serde_json::from_str::<serde_json::Value>(s) {
            Ok(v) => {
                let v = json_value(v, "");
                serde_json::to_string(&v).unwrap_or_else(|_| json_lenient(s))
            }
            Err(_) => json_lenient(s),
        },
        BodyKind::Form => form(s),
    })
}

#[derive(Clone, Copy)]
enum BodyKind {
    Json,
    Form,
}

/// `bytes` cut at a cap, less the token the cut may have split (a key cut
/// short is too short for its shape, but is still half a key) and a split
/// UTF-8 character.
fn cut_clean(bytes: &[u8]) -> &[u8] {
    let keep = bytes
        .iter()
        .rposition(|&b| !(b.is_ascii_alphanumeric() || b"_-.+/=%~".contains(&b) || b >= 0x80))
        .map_or(0, |i| i + 1);
    let bytes = &bytes[..keep];
    match std::str::from_utf8(bytes) {
        Err(e) if e.error_len().is_none() => &bytes[..e.valid_up_to()],
        _ => bytes,
    }
}

/// A parsed JSON value with secrets redacted; `key` is the name it stands
/// under (the enclosing key for an array's items, `""` at the top).
fn json_value(v: serde_json::Value, key: &str) -> serde_json::Value {
    use serde_json::Value;
    let secret = |value: &[u8]| secret_param(key.as_bytes(), value, Context::Param);
    match v {
        Value::String(s) if secret(s.as_bytes()) => Value::String(REDACTED.into()),
        Value::String(s) => Value::String(body_string(s)),
        // A float of twelve digits or more may be a card number written
        // `4111111111111111.0`.
        Value::Number(n)
            if secret(n.to_string().as_bytes())
                || (n.is_f64() && n.as_f64().is_some_and(|f| f.abs() >= 1e11)) =>
        {
            Value::String(REDACTED.into())
        }
        Value::Object(map) => {
            // `{"name": "password", "value": "…"}`: the value is named by a
            // sibling, not by its key.
            let named = ["name", "key"]
                .iter()
                .filter_map(|k| map.get(*k).and_then(Value::as_str))
                .any(|n| secret_param(n.as_bytes(), b"", Context::Param));
            Value::Object(
                map.into_iter()
                    .map(|(k, v)| {
                        let v = if (secret_param(k.as_bytes(), b"", Context::Param)
                            || (named && k == "value"))
                            && !matches!(v, Value::Null | Value::Bool(_))
                        {
                            Value::String(REDACTED.into())
                        } else {
                            json_value(v, &k)
                        };
                        (owned(k), v)
                    })
                    .collect(),
            )
        }
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| json_value(v, key)).collect())
        }
        other => other,
    }
}

/// The index of the bracket that closes the one at `open`, skipping
/// strings; `None` when the text ends first.
fn closing(b: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// JSON that does not parse (cut at the cap, or malformed), redacted string
/// by string: a string followed by `:` is a key, and the string or number
/// after it is redacted when the key names a secret (or it is a card
/// number), and so is a whole object or array under such a key; every
/// other string goes through [`text`]. Everything between
/// strings is copied as it is, bare numbers checked as card numbers.
fn json_lenient(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut key: Option<&str> = None;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let end = j.min(b.len());
                // Quotes and backslashes are ASCII: the cuts are on
                // character boundaries.
                let inner = &s[i + 1..end];
                let closed = j < b.len();
                let mut k = if closed { j + 1 } else { b.len() };
                while k < b.len() && b[k].is_ascii_whitespace() {
                    k += 1;
                }
                let is_key = key.is_none() && b.get(k) == Some(&b':');
                let name = key.take().unwrap_or("");
                out.push('"');
                if !is_key && secret_param(name.as_bytes(), inner.as_bytes(), Context::Param) {
                    out.push_str(REDACTED);
                } else if is_key {
                    out.push_str(&text(inner));
                } else {
                    out.push_str(&body_string(inner.to_string()));
                }
                if closed {
                    out.push('"');
                }
                if is_key {
                    // Escapes are not decoded here (`pass\u0077ord` is
                    // `password` to a server): such a key's value is taken
                    // for a secret.
                    key = Some(if inner.contains('\\') {
                        "secret"
                    } else {
                        inner
                    });
                }
                i = if closed { j + 1 } else { b.len() };
            }
            b'-' | b'0'..=b'9' => {
                let end = b[i..]
                    .iter()
                    .position(|c| !(c.is_ascii_digit() || b"-+.eE".contains(c)))
                    .map_or(b.len(), |n| i + n);
                let name = key.take().unwrap_or("");
                if secret_param(name.as_bytes(), &b[i..end], Context::Param) {
                    out.push_str(REDACTED);
                } else {
                    out.push_str(&s[i..end]);
                }
                i = end;
            }
            c if c.is_ascii_whitespace() || c == b':' => {
                out.push(char::from(c));
                i += 1;
            }
            b'{' | b'[' if key.is_some_and(|k| secret_param(k.as_bytes(), b"", Context::Param)) => {
                // A secret name over an object or array: all of it goes,
                // to its closing bracket or to the cut.
                key = None;
                out.push_str(REDACTED);
                i = closing(b, i).map_or(b.len(), |j| j + 1);
            }
            _ => {
                key = None;
                let ch = s[i..].chars().next().unwrap_or('\u{fffd}');
                out.push(ch);
                i += ch.len_utf8().max(1);
            }
        }
    }
    out
}

/// A string value of a captured body that no rule redacted by its name:
/// redacted as the ledger's text, and withheld whole when it still names a
/// secret (JSON or XML inside a string, `password: …`, a GraphQL argument):
/// the text scanner cannot see where such a value ends.
fn body_string(s: String) -> String {
    let s = owned(s);
    if names_secret(s.as_bytes()) {
        REDACTED.into()
    } else {
        s
    }
}

/// True when the letters and digits of `s`, lower-cased, hold a part of a
/// secret's name ([`SECRET_NAME_PARTS`], `passwd`, `pwd`).
fn names_secret(s: &[u8]) -> bool {
    let norm: Vec<u8> = s
        .iter()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(u8::to_ascii_lowercase)
        .collect();
    SECRET_NAME_PARTS
        .iter()
        .chain(&["passwd", "pwd"])
        .any(|p| has_part(&norm, p.as_bytes()))
}

/// A form body: [`query`], then every value that still names a secret
/// (JSON in a form field, as Slack's `payload=`) withheld whole.
fn form(s: &str) -> String {
    query(s)
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) if names_secret(&decoded(value)) => format!("{name}={REDACTED}"),
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// The text fields of a [`crate::entry::CapturedBody`]; sizes and digests
/// stay as they are.
fn captured(mut b: crate::entry::CapturedBody) -> crate::entry::CapturedBody {
    b.mime = b.mime.map(owned);
    b.file = b.file.map(owned);
    b.skipped = b.skipped.map(owned);
    b
}

/// A URL or path that may still carry a query: the query part is redacted
/// with [`query`], the rest with [`text`].
pub fn url(s: &str) -> String {
    match s.split_once('?') {
        Some((base, q)) => format!("{}?{}", text(base), query(q)),
        None => text(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_prefix_passes_the_pair_filter_and_others_do_not() {
        for (prefix, _, _) in SECRET_PREFIXES {
            let p = prefix.as_bytes();
            assert!(p.len() >= 2, "{prefix}");
            assert!(
                KEY_STARTS[usize::from(p[0])] && key_pair(p[0], p[1]),
                "{prefix}"
            );
        }
        for pair in ["st", "ww", "sa", "gm", "Ap", "xy", "s_"] {
            let p = pair.as_bytes();
            assert!(!key_pair(p[0], p[1]), "{pair}");
        }
    }

    #[test]
    fn the_untouched_shortcut_agrees_with_every_scanner() {
        for s in [
            "stripe",
            "api.stripe.com",
            "HTTP/1.1",
            "/v1/customers/cus_123",
            "/v1/x/%73k_live_4eC39HqLyjWDarjtT1zdp7dc",
            "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
            "https://user:pw@example.com/a",
            "https://example.com/a@b",
            "user@example.com",
            "Bearer abc.def",
            "basic%20dXNlcjpwYXNz",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
            "password=hunter2",
            "password%3Dhunter2",
            "4242424242424242",
            "%",
            "%zz",
            "",
        ] {
            assert_eq!(text(s), every_scanner(s), "{s:?}");
        }
    }

    /// The one-pass screen of `untouched` passes only text in which no
    /// scanner finds anything: random text built from the pieces every
    /// scanner looks for (each key prefix with a body, JWT parts, auth
    /// schemes in any case, assignments, encodings, URLs with users).
    #[test]
    fn the_screen_never_passes_text_a_scanner_would_change() {
        let mut pieces: Vec<String> = SECRET_PREFIXES
            .iter()
            .map(|(p, min, _)| format!("{p}{}", "aB3".repeat(min / 3 + 1)))
            .collect();
        pieces.extend(
            [
                "eyJhbGciOiJIUzI1NiJ9",
                ".",
                "eyJzdWIiOiIxIn0",
                "-",
                "_",
                "/",
                " ",
                "+",
                "Bearer ",
                "bEaReR",
                "BASIC ",
                "dXNlcjpwYXNz",
                "=",
                "&",
                ";",
                "?",
                "%73",
                "%5F",
                "%",
                "@",
                "://",
                "password",
                "token",
                "pin",
                "x",
                "A",
                "7",
                "4242424242424242",
                "stripe",
                "eyJ",
                "sk",
                "AKIA",
                "ABCDEFGHIJKLMNOP",
            ]
            .map(String::from),
        );
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut screened, mut total) = (0, 0);
        for _ in 0..50_000 {
            let len = 1 + next() % 6;
            let s: String = (0..len)
                .map(|_| pieces[(next() % pieces.len() as u64) as usize].as_str())
                .collect();
            total += 1;
            if quiet(s.as_bytes()) {
                screened += 1;
                assert!(scanners_find_nothing(&s), "{s:?}");
                assert_eq!(text(&s), s, "{s:?}");
            }
        }
        // The screen is exercised both ways.
        assert!(screened > 1000 && screened < total, "{screened} of {total}");
    }

    #[test]
    fn credential_headers_are_redacted_whole() {
        for name in [
            "Authorization",
            "authorization",
            "Proxy-Authorization",
            "Cookie",
            "Set-Cookie",
            "X-Api-Key",
            "api-key",
            "Stripe-Signature",
            "X-Custom-Token",
            "X-Client-Secret",
        ] {
            assert_eq!(header_value(name, "Basic dXNlcjpwYXNz"), REDACTED, "{name}");
        }
    }

    #[test]
    fn ordinary_headers_are_kept_but_scanned() {
        assert_eq!(header_value("Idempotency-Key", "abc-123"), "abc-123");
        assert_eq!(
            header_value("Content-Type", "application/json"),
            "application/json"
        );
        assert_eq!(header_value("Stripe-Account", "acct_1ABC"), "acct_1ABC");
        assert_eq!(
            header_value("X-Debug", "key=sk_test_4eC39HqLyjWDarjtT1zdp7dc"),
            "key=[redacted]"
        );
    }

    #[test]
    fn query_params_named_like_secrets_are_redacted() {
        assert_eq!(
            query("api_key=abc&limit=3&access_token=xyz&client_secret=s&password=p"),
            "api_key=[redacted]&limit=3&access_token=[redacted]&client_secret=[redacted]&password=[redacted]"
        );
        assert_eq!(
            query("apiKey=1&key=2&X-Amz-Signature=3&sig=4"),
            "apiKey=[redacted]&key=[redacted]&X-Amz-Signature=[redacted]&sig=[redacted]"
        );
        assert_eq!(query("code=4%2F0Ab&state=xyz"), "code=[redacted]&state=xyz");
        assert_eq!(query("api%5Fkey=abc"), "api%5Fkey=[redacted]");
        assert_eq!(query("auth=abc&authuser=0"), "auth=[redacted]&authuser=0");
    }

    #[test]
    fn query_keeps_ordinary_params_and_scans_values() {
        assert_eq!(
            query("customer=cus_123&expand[]=data"),
            "customer=cus_123&expand[]=data"
        );
        assert_eq!(query("q=sk_live_51HqLyjWDarjtT1zdp7dc"), "q=[redacted]");
        assert_eq!(query("a&&b="), "a&&b=");
        assert_eq!(query(""), "");
    }

    #[test]
    fn form_bodies_go_through_query() {
        assert_eq!(
            query("amount=2000&currency=usd&source=tok_visa&customer=cus_123&client_secret=pi_123_secret_abc"),
            "amount=2000&currency=usd&source=tok_visa&customer=cus_123&client_secret=[redacted]"
        );
        assert_eq!(
            query("grant_type=refresh_token&refresh_token=1//0gabc&client_id=123.apps"),
            "grant_type=refresh_token&refresh_token=[redacted]&client_id=123.apps"
        );
    }

    #[test]
    fn stripe_key_shapes_are_redacted_anywhere() {
        assert_eq!(text("sk_live_51HqLyjWDarjtT1zdp7dc"), REDACTED);
        assert_eq!(
            text("{\"key\":\"sk_test_4eC39HqLyjWDarjtT1zdp7dc\",\"id\":\"ch_3Mx\"}"),
            "{\"key\":\"[redacted]\",\"id\":\"ch_3Mx\"}"
        );
        assert_eq!(
            text("rk_live_abcdef123 and rk_test_abcdef123"),
            "[redacted] and [redacted]"
        );
        assert_eq!(text("whsec_abcdef123456"), REDACTED);
        assert_eq!(
            text("/v1/keys/sk_test_abcdef12/roll"),
            "/v1/keys/[redacted]/roll"
        );
    }

    #[test]
    fn ordinary_ids_are_not_redacted() {
        for s in [
            "cus_123",
            "ch_3MmlLrLkdIwHu7ix0snN0B15",
            "pk_test_TYooMQauvdEDq54NiTphI7jx",
            "task_live_abcdefgh",
            "/v1/customers/cus_NffrFeUfNV2Hib/sources",
            "sk_test_",
            "disk_test_abcdefgh",
        ] {
            assert_eq!(text(s), s);
        }
    }

    #[test]
    fn bearer_tokens_are_redacted() {
        assert_eq!(text("Bearer abc.def-ghi_jkl"), "Bearer [redacted]");
        assert_eq!(
            text("auth: bearer eyJhbGciOi+/=="),
            "auth: bearer [redacted]"
        );
        assert_eq!(text("Bearer [redacted]"), "Bearer [redacted]");
    }

    #[test]
    fn other_token_shapes_are_redacted() {
        assert_eq!(text("ghp_0123456789abcdefghijABCDEFGHIJ"), REDACTED);
        assert_eq!(text("xoxb-1234567890-abcdef"), REDACTED);
        assert_eq!(text("ya29.a0AfH6SMBx0123456789abcdef"), REDACTED);
        assert_eq!(text("AIzaSyA1234567890abcdefghijklmnopqrstu"), REDACTED);
    }

    #[test]
    fn url_passwords_are_redacted() {
        assert_eq!(
            text("https://user:hunter2@twin.example/s/x"),
            "https://user:[redacted]@twin.example/s/x"
        );
        assert_eq!(text("https://twin.example/a@b"), "https://twin.example/a@b");
        assert_eq!(text("http://user@host/"), "http://user@host/");
    }

    #[test]
    fn url_redacts_query_and_path() {
        assert_eq!(
            url("https://twin/s/sbx/stripe/v1/charges?api_key=x&limit=2"),
            "https://twin/s/sbx/stripe/v1/charges?api_key=[redacted]&limit=2"
        );
    }

    #[test]
    fn redaction_is_idempotent() {
        for s in [
            "Bearer abc",
            "sk_live_abcdefgh",
            "https://u:p@h/",
            "token=abc&x=sk_test_abcdefgh",
        ] {
            let once = text(&query(s));
            assert_eq!(text(&query(&once)), once);
        }
    }

    const JWT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c";
    const AWS_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";

    #[test]
    fn query_names_for_passwords_assertions_and_one_time_codes_are_redacted() {
        assert_eq!(
            query("pw=hunter2&client_assertion=abc.def&saml_assertion=PHNhbWw&otp=123456&totp=654321"),
            "pw=[redacted]&client_assertion=[redacted]&saml_assertion=[redacted]&otp=[redacted]&totp=[redacted]"
        );
        assert_eq!(
            query("pin=1234&passcode=9876&passphrase=a&jsessionid=ABC&PHPSESSID=xyz"),
            "pin=[redacted]&passcode=[redacted]&passphrase=[redacted]&jsessionid=[redacted]&PHPSESSID=[redacted]"
        );
        // `refresh` carries a refresh token unless it is a flag.
        assert_eq!(query("refresh=1%2F%2F0gabc"), "refresh=[redacted]");
    }

    #[test]
    fn query_names_that_are_not_secrets_stay_readable() {
        for q in [
            // Replay protection and CSRF correlation, echoed back in clear by design.
            "nonce=n-0S6_WzA2Mj&state=af0ifjsldkj",
            // Flags: Elasticsearch's `refresh=wait_for`, a pinned item.
            "refresh=true&refresh=wait_for&pin=false",
            // Which kind of credential, not the credential.
            "client_assertion_type=urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            "token_type_hint=refresh_token&grant_type=refresh_token",
            "pinned=1&option=2",
        ] {
            assert_eq!(query(q), q);
        }
    }

    #[test]
    fn credentials_after_an_auth_scheme_are_redacted_under_any_name() {
        assert_eq!(
            query("x=Bearer%20abc123def456&y=2"),
            "x=Bearer%20[redacted]&y=2"
        );
        assert_eq!(query("x=Bearer abc123def456"), "x=Bearer [redacted]");
        assert_eq!(query("x=bearer+abc123def456"), "x=bearer+[redacted]");
        assert_eq!(query("x=Basic%20dXNlcjpwYXNz"), "x=Basic%20[redacted]");
        assert_eq!(text("Basic dXNlcjpwYXNzd29yZA=="), "Basic [redacted]");
        assert_eq!(
            header_value("X-Forwarded-Auth", "Basic dXNlcjpwYXNz"),
            "Basic [redacted]"
        );
        // Only base64 of `user:pass` is a Basic credential; prose is kept.
        assert_eq!(text("basic auth failed"), "basic auth failed");
        assert_eq!(query("q=basic%20income"), "q=basic%20income");
        assert_eq!(query("x=Bearer%20"), "x=Bearer%20");
    }

    #[test]
    fn card_data_in_query_strings_and_forms_is_redacted() {
        let q = query(
            "card[number]=4000056655665556&card%5Bcvc%5D=314&card[exp_month]=12&number=4242%204242%204242%204242&cvv=123&bank_account[account_number]=000123456789",
        );
        for secret in ["4000056655665556", "314", "4242", "cvv=123", "000123456789"] {
            assert!(!q.contains(secret), "{secret} in {q}");
        }
        assert!(q.contains("card[exp_month]=12"), "{q}");
        // Digits that fail the Luhn check (an order id) stay readable.
        assert_eq!(query("order=4242424242424241"), "order=4242424242424241");
        assert_eq!(query("limit=100"), "limit=100");
    }

    #[test]
    fn key_shaped_names_are_redacted() {
        assert_eq!(query("sk_live_abc123def=1&limit=2"), "[redacted]=1&limit=2");
        assert_eq!(query("sk_live_abc123def"), "[redacted]");
        assert_eq!(query("sk_live_abc123key=1"), "[redacted]=[redacted]");
        assert_eq!(query("AKIAIOSFODNN7EXAMPLE=1"), "[redacted]=1");
        assert_eq!(text("/a;sk_live_abc123def=1/b"), "/a;[redacted]=1/b");
        assert_eq!(
            url("/v1/x?ghp_0123456789abcdefghijABCDEFGHIJ=1"),
            "/v1/x?[redacted]=1"
        );
    }

    #[test]
    fn percent_encoded_key_shapes_are_redacted() {
        assert_eq!(
            text("/v1/keys/sk%5Flive%5Fabc123def/roll"),
            "/v1/keys/[redacted]/roll"
        );
        assert_eq!(text("sk%5ftest%5fabcdef12"), REDACTED);
        assert_eq!(query("q=sk%5Flive%5Fabcdef12&x=1"), "q=[redacted]&x=1");
        assert_eq!(query("sk%5Flive%5Fabcdef12=1"), "[redacted]=1");
        assert_eq!(
            query("next=%2Fv1%2Fkeys%2Fsk_live_abcdef12%2Froll"),
            "next=%2Fv1%2Fkeys%2F[redacted]%2Froll"
        );
        assert_eq!(text("%73k_live_abcdef12"), REDACTED);
        for s in [
            "task%5Flive%5Fabcdefgh",
            "pk%5Ftest%5Fabcdefgh",
            "100%",
            "%zz%5",
        ] {
            assert_eq!(text(s), s);
        }
    }

    #[test]
    fn path_parameters_carrying_sessions_are_redacted() {
        assert_eq!(
            text("/shop/cart.jsp;jsessionid=ABC123DEF456"),
            "/shop/cart.jsp;jsessionid=[redacted]"
        );
        assert_eq!(text("/a;sessionid=XYZ789/b"), "/a;sessionid=[redacted]/b");
        assert_eq!(text("/a;token=abc;v=2"), "/a;token=[redacted];v=2");
        assert_eq!(
            url("/p;JSESSIONID=ABC123?limit=1"),
            "/p;JSESSIONID=[redacted]?limit=1"
        );
        assert_eq!(
            text("/a;jsessionid%3DABC123/b"),
            "/a;jsessionid%3D[redacted]/b"
        );
        // Ordinary matrix parameters and media-type parameters are kept.
        assert_eq!(
            text("/cars;color=red;year=2012/x"),
            "/cars;color=red;year=2012/x"
        );
        assert_eq!(
            header_value("Content-Type", "text/plain; charset=utf-8"),
            "text/plain; charset=utf-8"
        );
    }

    #[test]
    fn cloud_and_ai_token_shapes_are_redacted() {
        for s in [
            "AKIAIOSFODNN7EXAMPLE",
            "ASIAY34FZKBOKMUTVV7A",
            JWT,
            "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z",
            "sk-ant-api03-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAA",
            "sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z0123456789AB",
            "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123",
            "rk_live_51HqLyjWDarjtT1zdp7dc",
            "ya29.a0AfH6SMBx0123456789abcdef",
            "AIzaSyDdI0hCZtE6vySjMm-WEfRq3CPzqKqqsHI",
            "xoxp-1234567890-1234567890-abcdef",
            "xoxs-1234567890-abcdef",
            "xapp-1-A0123456789-1234567890-abcdef0123",
            "xoxe.xoxp-1-Mi0yLTEyMzQ1Njc4",
        ] {
            assert_eq!(text(s), REDACTED, "{s}");
            assert_eq!(query(&format!("x={s}")), "x=[redacted]", "{s}");
        }
        assert_eq!(
            text(&format!("id={} sig={JWT}.", "AKIAIOSFODNN7EXAMPLE")),
            "id=[redacted] sig=[redacted]."
        );
        // An unsigned JWT (`alg: none`) is still a bearer token.
        assert_eq!(
            text("t=eyJhbGciOiJub25lIn0.eyJzdWIiOiIxMjM0NTY3ODkwIn0."),
            "t=[redacted]"
        );
    }

    #[test]
    fn near_misses_of_token_shapes_stay_readable() {
        for s in [
            "AKIA1234",
            "AKIAIOSFODNN7EXAMPLEX",
            "AIDAIOSFODNN7EXAMPLE",
            "xAKIAIOSFODNN7EXAMPLE",
            "sk-prod-cluster.eu-west-1.amazonaws.com",
            "sk-learn-preprocessing-pipeline",
            "task-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z",
            "eyJhbGciOiJIUzI1NiJ9",
            "eyJhbGciOi.short.sig",
            "da39a3ee5e6b4b0d3255bfef95601890afd80709",
            // A bare 40-character base64 run is too common (digests, ids) to
            // take for an AWS secret without its name.
            AWS_SECRET,
        ] {
            assert_eq!(text(s), s);
        }
    }

    #[test]
    fn aws_secret_after_its_name_is_redacted() {
        assert_eq!(
            query(&format!(
                "aws_secret_access_key={AWS_SECRET}&region=us-east-1"
            )),
            "aws_secret_access_key=[redacted]&region=us-east-1"
        );
        assert_eq!(
            text(&format!(
                "aws_secret_access_key={AWS_SECRET} region=us-east-1"
            )),
            "aws_secret_access_key=[redacted] region=us-east-1"
        );
        assert_eq!(
            header_value("X-Debug", &format!("AWS_SECRET_ACCESS_KEY={AWS_SECRET}")),
            "AWS_SECRET_ACCESS_KEY=[redacted]"
        );
        // Only names that always mean a secret are taken from prose.
        assert_eq!(
            text("failed: client_secret=abc123 status code=404"),
            "failed: client_secret=[redacted] status code=404"
        );
        assert_eq!(
            text("https://x/cb?code=abc&state=1"),
            "https://x/cb?code=[redacted]&state=1"
        );
    }

    /// A webhook URL is the operator's, but its query may carry a token and
    /// an app's error text may quote the signing secret: neither is kept.
    #[test]
    fn callback_lines_are_redacted_like_requests() {
        let line = Entry::Callback(crate::entry::CallbackLine {
            service: "stripe".into(),
            event: "charge.succeeded".into(),
            event_id: "evt_1".into(),
            target: "127.0.0.1:4242".into(),
            method: "POST".into(),
            path: "/hooks/sk_live_abc123def".into(),
            query: Some("token=abc123".into()),
            status: Some(400),
            error: Some("bad secret whsec_0123456789abcdef0123".into()),
            duration_ms: 1,
            duration_us: None,
            attempt: 1,
            origin: "twin".into(),
            fault: None,
            tls: false,
        });
        let Entry::Callback(c) = entry(line) else {
            panic!("kind changed");
        };
        assert_eq!(c.path, "/hooks/[redacted]");
        assert_eq!(c.query.as_deref(), Some("token=[redacted]"));
        assert!(!c.error.unwrap_or_default().contains("whsec_0123"));
        assert_eq!(
            (c.event.as_str(), c.event_id.as_str()),
            ("charge.succeeded", "evt_1")
        );
    }

    #[test]
    fn entry_redacts_every_recorded_field() {
        use crate::entry::{Mode, MovedAside};
        let request = Entry::Request(RequestLine {
            query: Some("x=Bearer%20abc123&sk_live_abc123def=1".into()),
            duration_ms: 1,
            upstream: format!("https://twin/s/x/{JWT}"),
            headers: vec![
                ("sk_live_abc123def".into(), "1".into()),
                ("x-goog-iap-jwt-assertion".into(), "abc".into()),
                ("x-github-otp".into(), "123456".into()),
            ],
            ..RequestLine::test(
                "stripe",
                "GET",
                "/v1/keys/sk%5Flive%5Fabc123def;jsessionid=ABC123",
            )
        });
        let Entry::Request(RequestLine {
            path,
            query,
            upstream,
            headers,
            ..
        }) = entry(request)
        else {
            panic!("kind changed");
        };
        assert_eq!(path, "/v1/keys/[redacted];jsessionid=[redacted]");
        assert_eq!(query.as_deref(), Some("x=Bearer%20[redacted]&[redacted]=1"));
        assert_eq!(upstream, "https://twin/s/x/[redacted]");
        assert_eq!(
            headers,
            vec![
                ("[redacted]".to_string(), "1".to_string()),
                ("x-goog-iap-jwt-assertion".into(), REDACTED.into()),
                ("x-github-otp".into(), REDACTED.into()),
            ]
        );

        let session = Entry::Session(SessionLine {
            run_id: "r".into(),
            sandbox_id: "s".into(),
            mode: Mode::Strict,
            twin: "https://twin".into(),
            pid: 1,
            version: "1".into(),
            listen: "127.0.0.1:0".into(),
            moved_aside: Some(Box::new(MovedAside {
                file: "/s/ledger.jsonl.aside-1".into(),
                head_seq: 1,
                head_hash: "00".into(),
                why: "sealed by another key; last line had token=abc123".into(),
                requests: Some(3),
            })),
            ..SessionLine::test()
        });
        let Entry::Session(SessionLine { moved_aside, .. }) = entry(session) else {
            panic!("kind changed");
        };
        assert_eq!(
            moved_aside.map(|m| m.why),
            Some("sealed by another key; last line had token=[redacted]".into())
        );
    }

    #[test]
    fn every_rule_is_idempotent() {
        let inputs = [
            "pw=a&client_assertion=b&otp=1&pin=1234&refresh=1%2F%2F0g",
            "x=Bearer%20abc&y=Basic%20dXNlcjpwYXNz&z=bearer+abc",
            "sk_live_abc123def=1&sk%5Flive%5Fabcdef12=2",
            "/v1/keys/sk%5Flive%5Fabc123def/roll;jsessionid=ABC",
            "/a;token=abc;v=2?code=x",
            "AKIAIOSFODNN7EXAMPLE sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z",
            JWT,
            "aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "sk_live_abcdefBearer abc",
            "Bearer abc/sk_live_zzzzzz",
            "[redacted]=[redacted]&token=[redacted]",
        ];
        for s in inputs {
            let q = query(s);
            assert_eq!(query(&q), q, "query {s}");
            let t = text(s);
            assert_eq!(text(&t), t, "text {s}");
            let u = url(s);
            assert_eq!(url(&u), u, "url {s}");
            let h = header_value("x-debug", s);
            assert_eq!(header_value("x-debug", &h), h, "header {s}");
        }
    }

    #[test]
    fn adversarial_inputs_are_scanned_in_one_pass() {
        // Many near-misses in a row: each scanner must stay linear, so these
        // finish at once rather than after minutes.
        for unit in [
            "-eyJaaaaaaaaaaaa",
            "eyJaaaaaaaaaaa.bbbbbbbbbbbb-",
            "sk-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-",
            "%5F",
            "bearer ",
            "basic ",
            "basic+",
            "pin=",
            ";a=",
            "a=",
            "AKIA",
            "https://",
        ] {
            let s = unit.repeat(200_000 / unit.len());
            let once = text(&s);
            assert_eq!(text(&once), once, "{unit}");
            let q = query(&s);
            assert_eq!(query(&q), q, "{unit}");
        }
    }

    /// Secrets of every shape a captured body may carry, and pieces of
    /// them that must not survive either.
    const SK: &str = "sk_live_51HqLyjWDarjtT1zdp7dc";
    const PASSWORD: &str = "hunter2-Correct-Horse";
    const CARD: &str = "4242424242424242";
    const BEARER: &str = "Bearer abcDEF123ghiJKL456";

    fn stored(ct: &str, body: &str, truncated: bool) -> String {
        match super::body(Some(ct), body.as_bytes(), truncated) {
            BodyText::Text(t) => t,
            other => panic!("{ct}: not stored ({other:?})"),
        }
    }

    fn clean(out: &str) {
        for secret in [
            SK,
            "51HqLyjWDarjtT1zdp7dc",
            PASSWORD,
            CARD,
            "4242 4242",
            "abcDEF123ghiJKL456",
            "9271",
            JWT,
        ] {
            assert!(!out.contains(secret), "{secret} survived in {out}");
        }
    }

    /// The red team's shapes: secrets the text scanner cannot delimit
    /// inside JSON strings and form values, keys written with escapes in a
    /// body the parser rejects, UTF-16, form-encoded and float card
    /// numbers, one-time codes, cookies, and name/value pairs.
    #[test]
    fn secrets_in_strings_escapes_charsets_and_pairs_never_survive() {
        const PW: &str = "hunter2-Correct-Horse";
        let json_cases = [
            format!(r#"{{"data":"{{\"password\":\"{PW}\"}}"}}"#),
            format!(r#"{{"query":"mutation{{login(password:\"{PW}\")}}"}}"#),
            format!(r#"{{"note":"password: {PW}"}}"#),
            format!(r#"{{"xml":"<password>{PW}</password>"}}"#),
            format!(r#"{{"key":"password","value":"{PW}"}}"#),
            format!(r#"{{"name":"X-Api-Key","value":"{PW}"}}"#),
            format!(r#"{{"verification_code":"{PW}","mfa_code":"{PW}","sid":"{PW}"}}"#),
            format!(r#"{{"cookie":"connect.sid={PW}"}}"#),
            format!("\u{feff}{{\"pass\\u0077ord\":\"{PW}\"}}"),
        ];
        for body in &json_cases {
            let out = stored("application/json", body, false);
            assert!(!out.contains(PW), "{body} -> {out}");
        }
        // Escaped key in a body cut at the cap (the lenient scanner).
        let cut = format!(r#"{{"pass\u0077ord":"{PW}","pad":"{}"#, "x".repeat(100));
        let out = stored("application/json", &cut, true);
        assert!(!out.contains(PW), "{out}");
        // Float card numbers.
        for body in [
            r#"{"number":4111111111111111.0}"#,
            r#"{"n":4.111111111111111e15}"#,
        ] {
            let out = stored("application/json", body, false);
            assert!(
                !out.contains("4111") && !out.contains("4.111"),
                "{body} -> {out}"
            );
        }
        // Forms: JSON in a field, a card number with `+` for spaces.
        let out = stored(
            "application/x-www-form-urlencoded",
            &format!("payload=%7B%22password%22%3A%22{PW}%22%7D&pan=4242+4242+4242+4242&a=1"),
            false,
        );
        assert!(!out.contains(PW) && !out.contains("4242"), "{out}");
        assert!(out.ends_with("&a=1"), "{out}");
        // UTF-16 (NULs between the letters) and other charsets: not stored.
        let utf16: Vec<u8> = format!(r#"{{"password":"{PW}"}}"#)
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        assert_eq!(
            super::body(Some("application/json; charset=utf-16le"), &utf16, false),
            BodyText::Binary
        );
        assert_eq!(
            super::body(Some("application/json"), &utf16, false),
            BodyText::Binary
        );
        assert_eq!(
            super::body(Some("application/json; charset=latin1"), b"{}", false),
            BodyText::Binary
        );
        // What is not a secret stays readable.
        assert_eq!(
            stored(
                "application/json; charset=UTF-8",
                r#"{"amount":2000,"country_code":"US","description":"coffee"}"#,
                false
            ),
            r#"{"amount":2000,"country_code":"US","description":"coffee"}"#
        );
    }

    #[test]
    fn json_bodies_lose_the_values_of_secret_keys_and_every_key_shape() {
        let body = format!(
            r#"{{"email":"a@b.test","password":"{PASSWORD}","api_key":"{SK}","Authorization":"{BEARER}","card":{{"number":"{CARD}","cvc":"9271","exp_month":12}},"payment_method":{{"card":{{"number":{CARD}}}}},"tokens":["t1","t2"],"note":"key {SK} and {JWT}","list":["{CARD}"],"client_secret":{{"v":"x"}},"amount":2000,"refresh":true}}"#
        );
        let out = stored("application/json; charset=utf-8", &body, false);
        clean(&out);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["password"], REDACTED);
        assert_eq!(v["card"]["number"], REDACTED);
        assert_eq!(v["card"]["cvc"], REDACTED);
        assert_eq!(v["payment_method"]["card"]["number"], REDACTED);
        assert_eq!(v["tokens"], REDACTED);
        assert_eq!(v["client_secret"], REDACTED);
        assert_eq!(v["Authorization"], REDACTED);
        // What is not a secret stays readable.
        assert_eq!(v["email"], "a@b.test");
        assert_eq!(v["card"]["exp_month"], 12);
        assert_eq!(v["amount"], 2000);
        assert_eq!(v["refresh"], true);
        assert_eq!(v["note"], "key [redacted] and [redacted]");
        // A key can be a key.
        let out = stored(
            "application/vnd.api+json",
            &format!(r#"{{"{SK}":1}}"#),
            false,
        );
        clean(&out);
        // Redacting the stored text again changes nothing.
        assert_eq!(stored("application/json", &out, false), out);
    }

    #[test]
    fn json_cut_at_the_cap_is_redacted_string_by_string() {
        let body = format!(
            r#"{{"password":"{PASSWORD}","card":{{"number":{CARD},"cvc":"9271"}},"desc":"{BEARER}","key2":"{SK}"}}"#
        );
        // Every cut, including one inside a secret: nothing survives, not
        // even the front half of a key.
        for cut in 1..body.len() {
            let out = stored("application/json", &body[..cut], true);
            clean(&out);
            assert!(!out.contains("sk_live_51"), "{out}");
        }
        // A secret name over an array or object, cut or whole, in a body
        // that does not parse.
        for body in [
            r#"{"tokens":["abc-1","def-2"],"x":1,"#,
            r#"{"tokens":["abc-1","def-2"#,
            r#"{"client_secret":{"v":"abc-1","w":["]"]},"x":"#,
        ] {
            let out = stored("application/json", body, true);
            assert!(!out.contains("abc-1") && !out.contains("def-2"), "{out}");
        }
        assert_eq!(
            stored("application/json", r#"{"tokens":["abc-1"],"x":1,"#, false),
            r#"{"tokens":[redacted],"x":1,"#
        );
        // Malformed but whole: the same lenient scan.
        let out = stored(
            "application/json",
            &format!(r#"{{"password": "{PASSWORD}", oops "token":"abc"}}"#),
            false,
        );
        clean(&out);
        assert!(!out.contains("abc"), "{out}");
    }

    #[test]
    fn forms_text_and_binary_bodies() {
        let out = stored(
            "application/x-www-form-urlencoded",
            &format!("amount=2000&card[number]={CARD}&card[cvc]=9271&password={PASSWORD}&api_key={SK}&description=ok"),
            false,
        );
        clean(&out);
        assert!(out.starts_with("amount=2000&"), "{out}");
        assert!(out.ends_with("&description=ok"), "{out}");

        // Text whose secrets stand in a shape the text scanner does not
        // know (an XML element, a `name: value` line) is not stored at all.
        for (ct, body) in [
            (
                "application/xml",
                format!("<login><password>{PASSWORD}</password></login>"),
            ),
            (
                "text/xml; charset=utf-8",
                format!("<card><number>{CARD}</number></card>"),
            ),
            (
                "text/plain",
                format!("password: {PASSWORD}\nAuthorization: {BEARER}\n"),
            ),
            ("application/soap+xml", format!("<pin>{PASSWORD}</pin>")),
        ] {
            assert_eq!(
                super::body(Some(ct), body.as_bytes(), false),
                BodyText::Unstructured,
                "{ct}"
            );
        }

        for (ct, bytes) in [
            (Some("image/png"), &b"\x89PNG\r\n"[..]),
            (Some("application/octet-stream"), b"{}"),
            (None, b"{\"a\":1}"),
            (Some("application/json"), b"{\"a\":\"\xff\xfe\"}"),
        ] {
            assert_eq!(super::body(ct, bytes, false), BodyText::Binary, "{ct:?}");
        }
        // A character split by the cap is dropped, not taken for binary.
        assert_eq!(
            super::body(
                Some("application/x-www-form-urlencoded"),
                "a=1&b=caf\u{e9}".as_bytes().split_last().unwrap().1,
                true
            ),
            BodyText::Text("a=1&".into())
        );
    }
}
