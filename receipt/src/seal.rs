//! Seals: Ed25519 signatures over the ledger's chain head, so that a reader
//! can tell an untouched ledger from one that was edited and re-chained, and
//! (with a fresh seal demanded from the live proxy) from one whose tail was cut.
//!
//! Every session seals with a key of its own, made when it starts and kept
//! only in the proxy's memory ([`Sealer::generate`]): no private key is ever
//! written, so a workload of the proxy's uid has nothing to read and re-sign
//! with (the process is non-dumpable). The session line names the key; the
//! fingerprint a reader pins (`veris receipt --key`) is the one veris printed
//! for it. `<state>/ledger.pub` lists the public keys that sealed a ledger,
//! one `ed25519 <64 hex>` line each, newest last, mode 0644: a hint, never an
//! anchor (the workload can write it).
//!
//! A seal line (`kind: seal`) directly follows the line it seals:
//! `sealed_seq = seq - 1`. From ledger version 5 its signature covers
//! `veris-seal-v2 {sealed_seq} {prev} {reason}`, so every field a verdict
//! reads is signed (a `shutdown` seal is what closes a session); version 1
//! to 4 seals covered `veris-seal-v1 {sealed_seq} {prev}` and left the
//! reason unsigned ([`SealReport::unsigned_reasons`]). `prev` is the seal
//! line's own `prev` (the hash of the sealed line). `key_id` is the SHA-256
//! (hex) of the raw 32-byte public key. The private key never appears in
//! logs or errors.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

use crate::entry::{Entry, Line, LEDGER_VERSION};
use crate::hash::{hex, line_hash, unhex};

/// A private key file of an earlier veris (`serve` kept one here before
/// ledger version 5): never written now; a reader treats a pin of the key it
/// holds as a key that sat where the workload could read it.
pub const KEY_FILE: &str = "seal.key";
/// File name of the public key list in the state dir.
pub const PUB_FILE: &str = "ledger.pub";
/// The first ledger version whose seals sign their reason.
pub const SIGNED_REASON_SINCE: u32 = 5;

/// The seal a proxy writes when it stops: its session's last line.
pub const SHUTDOWN: &str = "shutdown";
/// A gateway sandbox's last seal when it leaves the gateway for good
/// (removed or expired): nothing follows it on that chain, ever; its id is
/// not served again there. A later start of the gateway writes a session
/// line to every sandbox it still holds, so a chain that ends in
/// `shutdown` while its gateway has started since is cut short.
pub const REMOVED: &str = "removed";

/// Whether a seal with this reason ends a session (nothing the session
/// wrote comes after it).
pub fn is_final(reason: &str) -> bool {
    reason == SHUTDOWN || reason == REMOVED
}

/// What can go wrong with seal keys.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("generating a seal key")]
    Generate,
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bad key pin {0:?}: expected a 64-digit hex fingerprint (the receipt's `seal key`) or a file holding fingerprints or `ed25519 <hex>` lines")]
    BadPin(String),
    #[error("reading public keys {path}")]
    ReadPub {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The text a seal of ledger version `v` signs.
pub fn message(v: u32, sealed_seq: u64, prev: &str, reason: &str) -> String {
    if v >= SIGNED_REASON_SINCE {
        format!("veris-seal-v2 {sealed_seq} {prev} {reason}")
    } else {
        format!("veris-seal-v1 {sealed_seq} {prev}")
    }
}

/// One session's private sealing key, in this process's memory only.
pub struct Sealer {
    pair: Ed25519KeyPair,
    key_id: String,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key itself.
        f.debug_struct("Sealer")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// A fresh key for one session. It is never written anywhere: the
    /// session's seals are the only thing it leaves.
    pub fn generate() -> Result<Sealer, SealError> {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| SealError::Generate)?;
        let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).map_err(|_| SealError::Generate)?;
        Ok(Sealer::from_pair(pair))
    }

    /// A fresh key and its PKCS#8 form, for a key that must outlive the
    /// process (an operator's or a gateway identity's, [`crate::fleet_cert`]):
    /// the caller writes it where only its owner reads it.
    pub fn generate_pkcs8() -> Result<(Sealer, Vec<u8>), SealError> {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| SealError::Generate)?;
        let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).map_err(|_| SealError::Generate)?;
        Ok((Sealer::from_pair(pair), doc.as_ref().to_vec()))
    }

    /// The key a PKCS#8 file holds; `None` when `der` is not an Ed25519 key.
    pub fn from_pkcs8(der: &[u8]) -> Option<Sealer> {
        let pair = Ed25519KeyPair::from_pkcs8(der)
            .or_else(|_| Ed25519KeyPair::from_pkcs8_maybe_unchecked(der))
            .ok()?;
        Some(Sealer::from_pair(pair))
    }

    /// Hex signature over `text` (a certificate's signed text: callers
    /// give each kind of text its own prefix, never a seal's).
    pub fn sign_text(&self, text: &str) -> String {
        hex(self.pair.sign(text.as_bytes()).as_ref())
    }

    fn from_pair(pair: Ed25519KeyPair) -> Sealer {
        let key_id = line_hash(pair.public_key().as_ref());
        Sealer { pair, key_id }
    }

    /// SHA-256 (hex) of the public key.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The raw public key, lower-case hex (what a session line carries).
    pub fn public_key_hex(&self) -> String {
        hex(self.pair.public_key().as_ref())
    }

    /// The public key as a [`PublicKeys`] entry.
    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            raw: self.pair.public_key().as_ref().to_vec(),
            key_id: self.key_id.clone(),
        }
    }

    /// Hex signature over a chain head `(sealed_seq, prev)` closed for
    /// `reason`, in the current ledger version's form.
    pub fn sign(&self, sealed_seq: u64, prev: &str, reason: &str) -> String {
        hex(self
            .pair
            .sign(message(LEDGER_VERSION, sealed_seq, prev, reason).as_bytes())
            .as_ref())
    }

    /// The seal entry for a chain head `(sealed_seq, prev)`.
    pub fn seal(&self, sealed_seq: u64, prev: &str, reason: &str) -> Entry {
        Entry::Seal {
            sealed_seq,
            signature: self.sign(sealed_seq, prev, reason),
            key_id: self.key_id.clone(),
            reason: reason.to_string(),
        }
    }

    /// Appends this key to `<dir>/ledger.pub` unless it is listed already.
    pub fn publish(&self, dir: &Path) -> Result<(), SealError> {
        let path = dir.join(PUB_FILE);
        let keys = PublicKeys::load(&path)?;
        if keys.keys.iter().any(|k| k.key_id == self.key_id) {
            return Ok(());
        }
        let err = |source| SealError::Write {
            path: path.clone(),
            source,
        };
        let mut opts = OpenOptions::new();
        opts.append(true).create(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            // A link planted at `ledger.pub` is an error, not followed.
            opts.mode(0o644).custom_flags(libc::O_NOFOLLOW);
        }
        let mut f = opts.open(&path).map_err(err)?;
        let line = format!("ed25519 {}\n", hex(self.pair.public_key().as_ref()));
        f.write_all(line.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(err)
    }
}

/// The public key of an Ed25519 private key file (PKCS#8, as an earlier
/// `serve` wrote `seal.key`), if `der` is one: a reader must know when the
/// key it is asked to pin sat in a file.
pub fn private_key_public(der: &[u8]) -> Option<PublicKey> {
    let pair = Ed25519KeyPair::from_pkcs8(der)
        .or_else(|_| Ed25519KeyPair::from_pkcs8_maybe_unchecked(der))
        .ok()?;
    Some(Sealer::from_pair(pair).public_key())
}

/// One Ed25519 public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub raw: Vec<u8>,
    pub key_id: String,
}

impl PublicKey {
    /// Whether `signature_hex` is this key's signature over `text`.
    pub fn verifies(&self, text: &str, signature_hex: &str) -> bool {
        unhex(signature_hex).is_some_and(|sig| {
            UnparsedPublicKey::new(&ED25519, &self.raw)
                .verify(text.as_bytes(), &sig)
                .is_ok()
        })
    }
}

/// The keys listed in `ledger.pub`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublicKeys {
    pub keys: Vec<PublicKey>,
}

impl PublicKeys {
    /// Reads `ledger.pub`; a missing file is an empty list. Lines that are
    /// not `ed25519 <64 hex>` are skipped (they can only make a seal fail).
    /// The workload may have planted a link, a FIFO or a huge file there:
    /// only a regular file is read (never blocking, at most 1 MiB).
    pub fn load(path: &Path) -> Result<PublicKeys, SealError> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let err = |source| SealError::ReadPub {
            path: path.to_path_buf(),
            source,
        };
        let file = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(PublicKeys::default()),
            Err(e) => return Err(err(e)),
        };
        if !file.metadata().map_err(err)?.is_file() {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not a regular file",
            )));
        }
        let mut text = String::new();
        file.take(1 << 20).read_to_string(&mut text).map_err(err)?;
        Ok(PublicKeys::parse(&text))
    }

    pub fn parse(text: &str) -> PublicKeys {
        let keys = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("ed25519 "))
            .filter_map(|h| unhex(h.trim()))
            .filter(|raw| raw.len() == 32)
            .map(|raw| PublicKey {
                key_id: line_hash(&raw),
                raw,
            })
            .collect();
        PublicKeys { keys }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// One key from its raw hex (64 digits); `None` if it is not one.
    pub fn from_hex(raw_hex: &str) -> Option<PublicKey> {
        let raw = unhex(raw_hex.trim()).filter(|r| r.len() == 32)?;
        Some(PublicKey {
            key_id: line_hash(&raw),
            raw,
        })
    }

    /// The key whose fingerprint is `key_id`, if listed.
    pub fn find(&self, key_id: &str) -> Option<&PublicKey> {
        self.keys.iter().find(|k| k.key_id == key_id)
    }

    /// Verifies one seal signature.
    pub fn verify(
        &self,
        seal: &SealFields<'_>,
        signature_hex: &str,
        key_id: &str,
    ) -> Result<(), SealFault> {
        let key = self
            .keys
            .iter()
            .find(|k| k.key_id == key_id)
            .ok_or(SealFault::UnknownKey)?;
        let sig = unhex(signature_hex).ok_or(SealFault::BadSignature)?;
        let text = message(seal.v, seal.sealed_seq, seal.prev, seal.reason);
        UnparsedPublicKey::new(&ED25519, &key.raw)
            .verify(text.as_bytes(), &sig)
            .map_err(|_| SealFault::BadSignature)
    }
}

/// What a seal signs, as read from its line.
#[derive(Debug, Clone, Copy)]
pub struct SealFields<'a> {
    /// The line's format version: it decides the signed text.
    pub v: u32,
    pub sealed_seq: u64,
    pub prev: &'a str,
    pub reason: &'a str,
}

/// Keys a reader pins (`veris receipt --key`): the trust anchor of an offline
/// verdict. A pin is a fingerprint (the receipt's `seal key`), which selects
/// the raw key a session line or `ledger.pub` offers only when its hash
/// matches, or raw keys given as `ed25519 <hex>` lines. How the reader got
/// the pin is part of it: a key read off a private key file was where a
/// workload could have read it too ([`Pin::key_file`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pin {
    /// Fingerprints (`key_id`) the reader trusts.
    pub fingerprints: Vec<String>,
    /// Raw keys the pin itself carried (`ed25519 <hex>` lines).
    pub keys: PublicKeys,
    /// A private key file that holds a pinned key (the pin was read from
    /// it, or it lies beside the ledger): that key's custody is lost.
    pub key_file: Option<String>,
}

impl Pin {
    /// Parses `--key`: a fingerprint, or the text of a file holding
    /// fingerprints (one a line) or `ed25519 <hex>` lines.
    pub fn parse(text: &str) -> Result<Pin, SealError> {
        let mut pin = Pin::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let fp = line
                .strip_prefix("sha256:")
                .unwrap_or(line)
                .to_ascii_lowercase();
            if crate::hash::is_sha256_hex(&fp) {
                pin.fingerprints.push(fp);
            } else if let Some(k) = line
                .strip_prefix("ed25519 ")
                .and_then(|h| PublicKeys::from_hex(h.trim()))
            {
                pin.fingerprints.push(k.key_id.clone());
                pin.keys.keys.push(k);
            } else {
                return Err(SealError::BadPin(line.chars().take(80).collect()));
            }
        }
        if pin.fingerprints.is_empty() {
            return Err(SealError::BadPin(text.trim().chars().take(80).collect()));
        }
        Ok(pin)
    }

    /// A pin of the key in a private key file (`der`, PKCS#8), marked as
    /// such; `None` when `der` is not an Ed25519 private key.
    pub fn of_key_file(der: &[u8], path: &str) -> Option<Pin> {
        let key = private_key_public(der)?;
        Some(Pin {
            fingerprints: vec![key.key_id.clone()],
            keys: PublicKeys { keys: vec![key] },
            key_file: Some(path.to_string()),
        })
    }

    /// Marks the pin when the private key file at `path` (bytes `der`)
    /// holds a pinned key.
    pub fn note_key_file(&mut self, der: &[u8], path: &str) {
        if let Some(k) = private_key_public(der) {
            if self.fingerprints.contains(&k.key_id) {
                self.key_file = Some(path.to_string());
            }
        }
    }

    /// The pinned keys among `offered` (raw hex keys from session lines and
    /// `ledger.pub`): only those whose hash is a pinned fingerprint.
    pub fn select<'a>(&self, offered: impl IntoIterator<Item = &'a str>) -> PublicKeys {
        let mut out = self.keys.clone();
        for raw in offered {
            if let Some(k) = PublicKeys::from_hex(raw) {
                if self.fingerprints.contains(&k.key_id) && out.find(&k.key_id).is_none() {
                    out.keys.push(k);
                }
            }
        }
        out
    }
}

/// Why one seal line does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealFault {
    /// `sealed_seq` is not the previous line's seq.
    NotAdjacent,
    /// `key_id` is not listed in `ledger.pub`.
    UnknownKey,
    /// The signature does not verify (a sealed line or the seal was edited).
    BadSignature,
}

impl std::fmt::Display for SealFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SealFault::NotAdjacent => "does not seal the line before it",
            SealFault::UnknownKey => "signed by a key other than the trusted one",
            SealFault::BadSignature => "signature does not verify",
        })
    }
}

/// Every seal line of a read, verified.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealReport {
    /// Seal lines that verified.
    pub valid: u64,
    /// `(seq, fault)` of the seal lines that did not (the first 16).
    pub faults: Vec<(u64, SealFault)>,
    /// Seq of the newest seal line that verified.
    pub last_valid: Option<u64>,
    /// A seal that verified was written before ledger version 5, whose
    /// signature left its `reason` out.
    pub unsigned_reasons: bool,
}

/// Verifies every seal line in `lines` against `keys`.
pub fn verify_lines(lines: &[Line], keys: &PublicKeys) -> SealReport {
    let mut report = SealReport::default();
    for line in lines {
        report.check(line, keys);
    }
    report
}

impl SealReport {
    /// Adds one line: a seal line is verified against `keys`, others are
    /// skipped. Lines must come in file order.
    pub fn check(&mut self, line: &Line, keys: &PublicKeys) {
        let Entry::Seal {
            sealed_seq,
            signature,
            key_id,
            reason,
        } = &line.entry
        else {
            return;
        };
        let fields = SealFields {
            v: line.v,
            sealed_seq: *sealed_seq,
            prev: &line.prev,
            reason,
        };
        let result = if line.seq.checked_sub(1) != Some(*sealed_seq) {
            Err(SealFault::NotAdjacent)
        } else {
            keys.verify(&fields, signature, key_id)
        };
        match result {
            Ok(()) => {
                self.valid += 1;
                self.last_valid = Some(line.seq);
                if line.v < SIGNED_REASON_SINCE {
                    self.unsigned_reasons = true;
                }
            }
            // The first fault decides; the rest need no memory.
            Err(fault) if self.faults.len() < 16 => self.faults.push((line.seq, fault)),
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::BlockedLine;
    use crate::entry::GENESIS_PREV;

    fn dir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "veris-seal-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn line(seq: u64, entry: Entry, prev: &str) -> Line {
        Line {
            v: LEDGER_VERSION,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry,
            prev: prev.into(),
        }
    }

    fn blocked() -> Entry {
        Entry::Blocked(BlockedLine {
            reason: "strict".into(),
            ..BlockedLine::test("x.test")
        })
    }

    #[test]
    fn each_key_is_new_and_only_its_public_half_is_written() {
        let d = dir();
        let a = Sealer::generate().unwrap();
        let b = Sealer::generate().unwrap();
        assert_ne!(a.key_id(), b.key_id());
        a.publish(&d).unwrap();
        a.publish(&d).unwrap();
        b.publish(&d).unwrap();
        let keys = PublicKeys::load(&d.join(PUB_FILE)).unwrap();
        assert_eq!(keys.keys, vec![a.public_key(), b.public_key()]);
        // Nothing private beside it.
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(PUB_FILE)]);
        // A link planted at ledger.pub is not followed.
        let other = d.join("elsewhere");
        std::fs::write(&other, "x").unwrap();
        std::fs::remove_file(d.join(PUB_FILE)).unwrap();
        std::os::unix::fs::symlink(&other, d.join(PUB_FILE)).unwrap();
        assert!(Sealer::generate().unwrap().publish(&d).is_err());
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "x");
        // Nor is a FIFO read (it would block the proxy's start).
        std::fs::remove_file(d.join(PUB_FILE)).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(d.join(PUB_FILE))
            .status()
            .unwrap();
        assert!(made.success());
        assert!(PublicKeys::load(&d.join(PUB_FILE)).is_err());
        assert!(Sealer::generate().unwrap().publish(&d).is_err());
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_pin_knows_when_its_key_sat_in_a_file() {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
        let pin = Pin::of_key_file(doc.as_ref(), "/s/seal.key").unwrap();
        assert_eq!(pin.key_file.as_deref(), Some("/s/seal.key"));
        assert!(Pin::of_key_file(b"not a key", "x").is_none());
        let mut by_print = Pin::parse(&pin.fingerprints[0]).unwrap();
        assert_eq!(by_print.key_file, None);
        by_print.note_key_file(b"garbage", "/s/seal.key");
        assert_eq!(by_print.key_file, None);
        by_print.note_key_file(doc.as_ref(), "/s/seal.key");
        assert_eq!(by_print.key_file.as_deref(), Some("/s/seal.key"));
        // Several fingerprints, one a line, and key lines mixed.
        let other = Sealer::generate().unwrap();
        let text = format!(
            "{}\ned25519 {}\n",
            pin.fingerprints[0],
            other.public_key_hex()
        );
        let both = Pin::parse(&text).unwrap();
        assert_eq!(
            both.fingerprints,
            vec![pin.fingerprints[0].clone(), other.key_id().to_string()]
        );
        assert!(Pin::parse("nonsense").is_err());
        assert!(Pin::parse(&format!("{}\nnonsense", pin.fingerprints[0])).is_err());
    }

    #[test]
    fn seals_verify_and_tampering_is_caught() {
        let sealer = Sealer::generate().unwrap();
        let keys = PublicKeys {
            keys: vec![sealer.public_key()],
        };
        let l1 = line(1, blocked(), GENESIS_PREV);
        let h1 = line_hash(serde_json::to_string(&l1).unwrap().as_bytes());
        let l2 = line(2, sealer.seal(1, &h1, "demand"), &h1);
        let report = verify_lines(&[l1.clone(), l2.clone()], &keys);
        assert_eq!(report.valid, 1);
        assert_eq!(report.last_valid, Some(2));
        assert!(report.faults.is_empty());

        // The sealed line was edited and the chain recomputed: the seal's
        // prev changes and the signature no longer covers it.
        let mut forged = l2.clone();
        forged.prev = "ab".repeat(32);
        assert_eq!(
            verify_lines(&[forged], &keys).faults,
            vec![(2, SealFault::BadSignature)]
        );
        // A seal moved elsewhere no longer seals the line before it.
        let mut moved = l2.clone();
        moved.seq = 5;
        assert_eq!(
            verify_lines(&[moved], &keys).faults,
            vec![(5, SealFault::NotAdjacent)]
        );
        // The reason is signed: an interval seal relabelled as the final
        // one no longer verifies.
        let mut relabelled = l2.clone();
        if let Entry::Seal { reason, .. } = &mut relabelled.entry {
            *reason = "shutdown".into();
        }
        assert_eq!(
            verify_lines(&[relabelled.clone()], &keys).faults,
            vec![(2, SealFault::BadSignature)]
        );
        // Nor does it pass for an older line that did not sign its reason.
        relabelled.v = 4;
        assert_eq!(
            verify_lines(&[relabelled], &keys).faults,
            vec![(2, SealFault::BadSignature)]
        );
        // A version 4 seal (reason unsigned) still verifies, and says so.
        let old_sig = hex(sealer
            .pair
            .sign(message(4, 1, &h1, "x").as_bytes())
            .as_ref());
        let mut old = l2.clone();
        old.v = 4;
        if let Entry::Seal { signature, .. } = &mut old.entry {
            *signature = old_sig;
        }
        let report = verify_lines(&[old], &keys);
        assert_eq!((report.valid, report.unsigned_reasons), (1, true));
        assert!(!verify_lines(std::slice::from_ref(&l2), &keys).unsigned_reasons);
        // A seal by another key.
        let other = Sealer::generate().unwrap();
        let l2b = line(2, other.seal(1, &h1, "demand"), &h1);
        assert_eq!(
            verify_lines(&[l2b], &keys).faults,
            vec![(2, SealFault::UnknownKey)]
        );
    }
}
