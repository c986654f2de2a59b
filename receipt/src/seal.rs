//! Seals: Ed25519 signatures over the ledger's chain head, so that a reader
//! can tell an untouched ledger from one that was edited and re-chained, and
//! (with a fresh seal demanded from the live proxy) from one whose tail was cut.
//!
//! Key material lives beside the ledger as files:
//! - `<state>/seal.key`: the private key, PKCS#8 v2 DER, mode 0600, readable
//!   only by the proxy uid. Created once, reused across restarts.
//! - `<state>/ledger.pub`: the public keys that ever sealed this ledger, one
//!   `ed25519 <64 hex>` line each, newest last, mode 0644. A key that is
//!   replaced (seal.key deleted) stays listed so older seals keep verifying.
//!
//! A seal line (`kind: seal`) directly follows the line it seals:
//! `sealed_seq = seq - 1`, and its signature covers the ASCII text
//! `veris-seal-v1 {sealed_seq} {prev}` where `prev` is the seal line's own
//! `prev` (the hash of the sealed line). `key_id` is the SHA-256 (hex) of the
//! raw 32-byte public key. The private key never appears in logs or errors.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

use crate::entry::{Entry, Line};
use crate::hash::{hex, line_hash, unhex};

/// File name of the private key in the state dir.
pub const KEY_FILE: &str = "seal.key";
/// File name of the public key list in the state dir.
pub const PUB_FILE: &str = "ledger.pub";

/// What can go wrong with seal keys.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("reading seal key {path}")]
    ReadKey {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("seal key {path} is not an Ed25519 PKCS#8 key; move it aside to let the proxy create a new one")]
    ParseKey { path: PathBuf },
    #[error("generating a seal key")]
    Generate,
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bad key pin {0:?}: expected a 64-digit hex fingerprint (the receipt's `seal key`) or a file holding one, or `ed25519 <hex>` lines")]
    BadPin(String),
    #[error("reading public keys {path}")]
    ReadPub {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The text a seal signs.
pub fn message(sealed_seq: u64, prev: &str) -> String {
    format!("veris-seal-v1 {sealed_seq} {prev}")
}

/// The private sealing key of one state dir.
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
    /// Loads `<dir>/seal.key`, or creates it (0600) when missing, and makes
    /// sure `<dir>/ledger.pub` lists its public key.
    pub fn load_or_create(dir: &Path) -> Result<Sealer, SealError> {
        let path = dir.join(KEY_FILE);
        let sealer = match std::fs::read(&path) {
            Ok(der) => {
                let pair = Ed25519KeyPair::from_pkcs8(&der)
                    .or_else(|_| Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der))
                    .map_err(|_| SealError::ParseKey { path: path.clone() })?;
                restrict_mode(&path)?;
                Sealer::from_pair(pair)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
                    .map_err(|_| SealError::Generate)?;
                write_new_private(&path, doc.as_ref())?;
                let pair =
                    Ed25519KeyPair::from_pkcs8(doc.as_ref()).map_err(|_| SealError::Generate)?;
                tracing::info!(key = %path.display(), "created the ledger seal key");
                Sealer::from_pair(pair)
            }
            Err(source) => return Err(SealError::ReadKey { path, source }),
        };
        sealer.publish(&dir.join(PUB_FILE))?;
        Ok(sealer)
    }

    /// A throwaway in-memory key (tests, and tools that only verify).
    pub fn ephemeral() -> Result<Sealer, SealError> {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| SealError::Generate)?;
        let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).map_err(|_| SealError::Generate)?;
        Ok(Sealer::from_pair(pair))
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

    /// Hex signature over a chain head `(sealed_seq, prev)`.
    pub fn sign(&self, sealed_seq: u64, prev: &str) -> String {
        hex(self
            .pair
            .sign(message(sealed_seq, prev).as_bytes())
            .as_ref())
    }

    /// The seal entry for a chain head `(sealed_seq, prev)`.
    pub fn seal(&self, sealed_seq: u64, prev: &str, reason: &str) -> Entry {
        Entry::Seal {
            sealed_seq,
            signature: self.sign(sealed_seq, prev),
            key_id: self.key_id.clone(),
            reason: reason.to_string(),
        }
    }

    /// Appends this key to `ledger.pub` unless it is listed already.
    fn publish(&self, path: &Path) -> Result<(), SealError> {
        let keys = PublicKeys::load(path)?;
        if keys.keys.iter().any(|k| k.key_id == self.key_id) {
            return Ok(());
        }
        let err = |source| SealError::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut opts = OpenOptions::new();
        opts.append(true).create(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o644);
        }
        let mut f = opts.open(path).map_err(err)?;
        let line = format!("ed25519 {}\n", hex(self.pair.public_key().as_ref()));
        f.write_all(line.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(err)
    }
}

/// Creates a private file that must not exist yet, mode 0600 from the start.
fn write_new_private(path: &Path, bytes: &[u8]) -> Result<(), SealError> {
    let err = |source| SealError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut opts = OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(err)?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(err)
}

/// An existing key that others can read is tightened to 0600 (an umask or a
/// copy may have loosened it); the key stays valid, only its exposure ends.
fn restrict_mode(path: &Path) -> Result<(), SealError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let err = |source| SealError::ReadKey {
            path: path.to_path_buf(),
            source,
        };
        let mode = std::fs::metadata(path).map_err(err)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(key = %path.display(), mode = format!("{mode:o}"), "seal key was readable by others; setting it to 0600");
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        }
    }
    Ok(())
}

/// One Ed25519 public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub raw: Vec<u8>,
    pub key_id: String,
}

/// The keys listed in `ledger.pub`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublicKeys {
    pub keys: Vec<PublicKey>,
}

impl PublicKeys {
    /// Reads `ledger.pub`; a missing file is an empty list. Lines that are
    /// not `ed25519 <64 hex>` are skipped (they can only make a seal fail).
    pub fn load(path: &Path) -> Result<PublicKeys, SealError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(PublicKeys::parse(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(PublicKeys::default()),
            Err(source) => Err(SealError::ReadPub {
                path: path.to_path_buf(),
                source,
            }),
        }
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
        sealed_seq: u64,
        prev: &str,
        signature_hex: &str,
        key_id: &str,
    ) -> Result<(), SealFault> {
        let key = self
            .keys
            .iter()
            .find(|k| k.key_id == key_id)
            .ok_or(SealFault::UnknownKey)?;
        let sig = unhex(signature_hex).ok_or(SealFault::BadSignature)?;
        UnparsedPublicKey::new(&ED25519, &key.raw)
            .verify(message(sealed_seq, prev).as_bytes(), &sig)
            .map_err(|_| SealFault::BadSignature)
    }
}

/// Keys a reader pins (`veris receipt --key`): the trust anchor of an offline
/// verdict. A pin is a fingerprint (the receipt's `seal key`), which selects
/// the raw key a session line or `ledger.pub` offers only when its hash
/// matches, or raw keys given as `ed25519 <hex>` lines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pin {
    /// Fingerprints (`key_id`) the reader trusts.
    pub fingerprints: Vec<String>,
    /// Raw keys the pin itself carried (`ed25519 <hex>` lines).
    pub keys: PublicKeys,
}

impl Pin {
    /// Parses `--key`: a fingerprint, or the text of a file holding a
    /// fingerprint or `ed25519 <hex>` lines.
    pub fn parse(text: &str) -> Result<Pin, SealError> {
        let t = text.trim();
        let fp = t.strip_prefix("sha256:").unwrap_or(t).to_ascii_lowercase();
        if crate::hash::is_sha256_hex(&fp) {
            return Ok(Pin {
                fingerprints: vec![fp],
                keys: PublicKeys::default(),
            });
        }
        let keys = PublicKeys::parse(text);
        if keys.is_empty() {
            return Err(SealError::BadPin(t.chars().take(80).collect()));
        }
        Ok(Pin {
            fingerprints: keys.keys.iter().map(|k| k.key_id.clone()).collect(),
            keys,
        })
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
            ..
        } = &line.entry
        else {
            return;
        };
        let result = if line.seq.checked_sub(1) != Some(*sealed_seq) {
            Err(SealFault::NotAdjacent)
        } else {
            keys.verify(*sealed_seq, &line.prev, signature, key_id)
        };
        match result {
            Ok(()) => {
                self.valid += 1;
                self.last_valid = Some(line.seq);
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
    use crate::entry::{ListenerTier, GENESIS_PREV};

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
            v: 1,
            seq,
            ts: "2026-11-29T07:28:19.123Z".into(),
            entry,
            prev: prev.into(),
        }
    }

    fn blocked() -> Entry {
        Entry::Blocked {
            host: "x.test".into(),
            port: 443,
            tier: ListenerTier::Explicit,
            method: None,
            path: None,
            reason: "strict".into(),
            dst: None,
        }
    }

    #[test]
    fn key_files_are_created_private_and_reused() {
        let d = dir();
        let a = Sealer::load_or_create(&d).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(d.join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let b = Sealer::load_or_create(&d).unwrap();
        assert_eq!(a.key_id(), b.key_id());
        let keys = PublicKeys::load(&d.join(PUB_FILE)).unwrap();
        assert_eq!(keys.keys, vec![a.public_key()]);
        // A replaced key is added; the old one stays so old seals verify.
        std::fs::remove_file(d.join(KEY_FILE)).unwrap();
        let c = Sealer::load_or_create(&d).unwrap();
        assert_ne!(c.key_id(), a.key_id());
        let keys = PublicKeys::load(&d.join(PUB_FILE)).unwrap();
        assert_eq!(keys.keys, vec![a.public_key(), c.public_key()]);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_loose_key_file_is_tightened() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir();
        Sealer::load_or_create(&d).unwrap();
        let key = d.join(KEY_FILE);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        Sealer::load_or_create(&d).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn garbage_key_is_an_error_not_a_new_key() {
        let d = dir();
        std::fs::write(d.join(KEY_FILE), b"not a key").unwrap();
        let err = Sealer::load_or_create(&d).unwrap_err();
        assert!(matches!(err, SealError::ParseKey { .. }), "{err:?}");
        assert_eq!(std::fs::read(d.join(KEY_FILE)).unwrap(), b"not a key");
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn seals_verify_and_tampering_is_caught() {
        let sealer = Sealer::ephemeral().unwrap();
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
        // A seal by another key.
        let other = Sealer::ephemeral().unwrap();
        let l2b = line(2, other.seal(1, &h1, "demand"), &h1);
        assert_eq!(
            verify_lines(&[l2b], &keys).faults,
            vec![(2, SealFault::UnknownKey)]
        );
    }
}
