//! A gateway sandbox's registration record (DESIGN §13): what of a sandbox
//! survives a gateway restart, and what G2 keeps in its key-value bucket.
//! It holds digests, never a secret: the password's SHA-256 and the read
//! token's SHA-256 (both high-entropy, so a plain digest is enough), so a
//! reader of the record can neither log in as the sandbox nor read its
//! ledger.
//!
//! On disk it is `<state>/sandboxes/<id>/sandbox.json`, written as a fresh
//! 0600 file renamed into place ([`veris_ca::fsutil::write_file`]: temp,
//! fsync, rename). Removal rewrites it `revoked`, so a removed sandbox never
//! comes back. [`load_all`] reads every record defensively: whatever a
//! workload may have planted there (a symlink, a FIFO, a directory link, a
//! huge or malformed file, a record whose id is not its directory's) is
//! skipped with a log line naming the path and why, never followed, never
//! blocked on.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};
use veris_receipt::Mode;

use super::gateway::valid_id;

/// The record's file name in the sandbox's directory.
pub const RECORD_FILE: &str = "sandbox.json";

/// The most bytes a record may have (a real one is well under 2 KiB).
pub const RECORD_CAP: u64 = 64 * 1024;

/// The record format this veris writes and reads.
pub const RECORD_VERSION: u32 = 1;

/// One sandbox's registration, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    pub v: u32,
    pub id: String,
    /// SHA-256 of its password, lower-case hex.
    pub password_sha256: String,
    /// SHA-256 of its read token, lower-case hex.
    pub read_token_sha256: String,
    /// Its services (its routes: each service's hosts go to the twin).
    pub services: Vec<String>,
    pub mode: Mode,
    /// Its own twin base; none: the twin of the gateway run serving it.
    pub twin: Option<String>,
    pub limits: RecordLimits,
    /// Unix milliseconds.
    pub created_ms: u64,
    /// When it stops being served, unix milliseconds, if ever.
    pub expires_ms: Option<u64>,
    /// When it was removed, unix milliseconds: never served again.
    #[serde(default)]
    pub revoked_ms: Option<u64>,
    /// Where its webhook events go (`--webhook SERVICE=URL` values). The
    /// URLs only: their signing secrets live in their own 0600 file beside
    /// the record ([`crate::runtime::gateway`]'s `webhook.secrets`), never
    /// here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webhooks: Vec<String>,
    /// `--webhook-faults` of its deliveries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub webhook_faults: Vec<String>,
}

/// A sandbox's own limits, as registered: connections open at once,
/// requests and bytes a second (0: no limit on that rate).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordLimits {
    /// Its open connections at most.
    pub max_connections: usize,
    #[serde(default)]
    pub max_rps: u32,
    #[serde(default)]
    pub max_bytes_per_sec: u64,
}

/// Unix milliseconds of `t` (0 before 1970).
pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The time `ms` unix milliseconds name.
pub fn from_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Lower-case hex of a digest.
pub fn hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest lower-case `hex` spells, if it is 64 hex digits.
pub fn digest_from_hex(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Record {
    /// Its password digest.
    pub fn password(&self) -> Option<[u8; 32]> {
        digest_from_hex(&self.password_sha256)
    }

    /// Its read token digest.
    pub fn read_token(&self) -> Option<[u8; 32]> {
        digest_from_hex(&self.read_token_sha256)
    }

    pub fn expires(&self) -> Option<SystemTime> {
        self.expires_ms.map(from_unix_ms)
    }

    /// Whether a record read back may be served: its version, its id (the
    /// same as its directory's), its digests.
    pub fn check(&self, dir_name: &str) -> Result<()> {
        if self.v != RECORD_VERSION {
            bail!(
                "record version {} (this veris reads {RECORD_VERSION})",
                self.v
            );
        }
        valid_id(&self.id)?;
        if self.id != dir_name {
            bail!(
                "its id {:?} is not its directory's name {dir_name:?}",
                self.id
            );
        }
        if self.password().is_none() || self.read_token().is_none() {
            bail!("its password or read-token digest is not 64 lower-case hex digits");
        }
        if self.limits.max_connections == 0 {
            bail!("its connection limit is 0");
        }
        Ok(())
    }

    /// Writes it to `dir/sandbox.json`: a fresh 0600 file, fsynced, renamed
    /// into place.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(RECORD_FILE);
        let mut body = serde_json::to_vec_pretty(self)?;
        body.push(b'\n');
        veris_ca::fsutil::write_file(&path, &body, 0o600)
            .with_context(|| format!("writing the sandbox record {}", path.display()))
    }
}

/// Every record under `sandboxes` that is to be served again, sorted by id.
/// Each one skipped gets a log line: why, and its path.
/// The records [`load_all`] found: to serve, and ended (removed or
/// expired), whose chains may still need their final `removed` seal.
#[derive(Default)]
pub struct Stored {
    pub live: Vec<Record>,
    pub ended: Vec<Record>,
}

pub fn load_all(sandboxes: &Path, now: SystemTime) -> Stored {
    let entries = match std::fs::read_dir(sandboxes) {
        Ok(e) => e,
        Err(e) => {
            warn!(dir = %sandboxes.display(), error = %e, "cannot list the sandbox records; none restored");
            return Stored::default();
        }
    };
    let mut out = Stored::default();
    for entry in entries {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let path = entry.path().join(RECORD_FILE);
        let shown = path.display();
        let Some(name) = name.to_str().filter(|n| valid_id(n).is_ok()) else {
            warn!(path = %shown, "skipped a sandbox record: its directory's name is not a sandbox id");
            continue;
        };
        // The entry's own type (lstat): a link to a directory is not one.
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            warn!(path = %entry.path().display(), "skipped a sandbox record: the sandbox's entry is not a directory (a link is never followed)");
            continue;
        }
        match load(&entry.path(), name) {
            Ok(None) => {}
            Ok(Some(r)) if r.revoked_ms.is_some() => {
                info!(sandbox = %r.id, "not restoring a removed sandbox");
                out.ended.push(r);
            }
            Ok(Some(r)) if r.expires().is_some_and(|e| now >= e) => {
                info!(sandbox = %r.id, path = %shown, "not restoring an expired sandbox (its --ttl ran out)");
                out.ended.push(r);
            }
            Ok(Some(r)) => out.live.push(r),
            Err(e) => {
                warn!(path = %shown, error = %format!("{e:#}"), "skipped a sandbox record that cannot be served: the sandbox stays refused. Next: remove its directory, or add it again");
            }
        }
    }
    out.live.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

/// The record in `dir` (named `name`), none when there is none.
pub fn load(dir: &Path, name: &str) -> Result<Option<Record>> {
    let path = dir.join(RECORD_FILE);
    let bytes = match crate::util::read_bounded_bytes(&path, RECORD_CAP, false) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).context(
            "not a regular file of at most 64 KiB (a symlink or a FIFO is never opened through)",
        ),
    };
    let record: Record = serde_json::from_slice(&bytes).context("not a sandbox record")?;
    record.check(name)?;
    Ok(Some(record))
}

/// A well-formed record for tests (password `pw`, read token `tok`).
#[cfg(test)]
pub(crate) fn sample(id: &str) -> Record {
    Record {
        v: RECORD_VERSION,
        id: id.into(),
        password_sha256: hex(&super::gateway::digest("pw")),
        read_token_sha256: hex(&super::gateway::digest("tok")),
        services: vec!["stripe".into()],
        mode: Mode::Strict,
        twin: None,
        limits: RecordLimits {
            max_connections: 8,
            max_rps: 0,
            max_bytes_per_sec: 0,
        },
        created_ms: 1,
        expires_ms: None,
        revoked_ms: None,
        webhooks: Vec::new(),
        webhook_faults: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_through_hex() {
        let d = super::super::gateway::digest("abc");
        assert_eq!(digest_from_hex(&hex(&d)), Some(d));
        assert_eq!(digest_from_hex(&hex(&d).to_uppercase()), None);
        assert_eq!(digest_from_hex("ab"), None);
    }

    #[test]
    fn a_record_must_name_its_own_directory() {
        assert!(sample("sbx-a").check("sbx-a").is_ok());
        assert!(sample("sbx-a").check("sbx-b").is_err());
        assert!(sample("../x").check("../x").is_err());
        let mut bad = sample("sbx-a");
        bad.password_sha256 = "zz".into();
        assert!(bad.check("sbx-a").is_err());
    }
}
