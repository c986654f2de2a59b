//! A gateway's fleet identity (`veris gateway --fleet-identity DIR`, G2,
//! DESIGN §14): the identity key and its certificate `veris fleet-key
//! certify` made, loaded with care at start, and this run's seal key
//! certified with it and stored in the fleet's key bucket (`VERIS_KEYS`,
//! key `<gateway>.<seal key fingerprint>`), retried in the background until
//! written: a reader who pins the operator key then verifies this run's
//! chains without learning its seal key (`veris receipt --fleet-key`).
//!
//! Also the one reader of the private key files (`operator.key`,
//! `identity.key`): only a regular file of this uid's, not through a link,
//! and refused when others may read it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use veris_fleet::registry::{Registry, KEYS_BUCKET};
use veris_receipt::fleet_cert::{entry_key, IdentityCert, KeyEntry, SealKeyCert};
use veris_receipt::seal::Sealer;

/// The identity directory's files.
pub const IDENTITY_KEY: &str = "identity.key";
pub const IDENTITY_CERT: &str = "identity.cert";

/// Unix ms now.
pub fn now_ms() -> u64 {
    crate::tier::gateway_record::unix_ms(SystemTime::now())
}

/// The Ed25519 private key in `path` (PKCS#8, as `veris fleet-key` writes
/// it): refused when the file is readable or writable by group or others.
pub fn load_private_key(path: &Path, what: &str) -> Result<Sealer> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("reading the {what} {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        bail!(
            "the {what} {} is readable by others (mode {mode:04o}): a private key must be the owner's alone. Next: chmod 600 {}, and make a new key if others may have read it",
            path.display(),
            path.display()
        );
    }
    let der = crate::util::read_bounded_bytes(path, 16 * 1024, false)
        .with_context(|| format!("reading the {what} {}", path.display()))?;
    Sealer::from_pkcs8(&der).with_context(|| {
        format!(
            "the {what} {} is not an Ed25519 private key (PKCS#8). Next: give the file `veris fleet-key` wrote",
            path.display()
        )
    })
}

/// An identity key and its certificate.
pub struct Identity {
    key: Sealer,
    cert: IdentityCert,
}

impl Identity {
    /// Loads `dir` for the gateway named `gateway`: refused when the
    /// certificate is another gateway's, is not for this key, or expired.
    pub fn load(dir: &Path, gateway: &str) -> Result<Identity> {
        let key = load_private_key(&dir.join(IDENTITY_KEY), "identity key")?;
        let cert_path = dir.join(IDENTITY_CERT);
        let text = crate::util::read_bounded(&cert_path, 16 * 1024, false)
            .with_context(|| format!("reading {}", cert_path.display()))?;
        let cert: IdentityCert = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not an identity certificate. Next: give the directory `veris fleet-key certify --out` wrote",
                cert_path.display()
            )
        })?;
        if cert.gateway != gateway {
            bail!(
                "the identity in {} is gateway {:?}'s, and this gateway publishes as {gateway:?}: readers would trust none of its seal keys. Next: start it with --nats-name {}, or certify an identity for {gateway} (veris fleet-key certify --gateway {gateway})",
                dir.display(),
                cert.gateway,
                cert.gateway
            );
        }
        if cert.identity().map(|k| k.key_id) != Some(key.key_id().to_string()) {
            bail!(
                "{} certifies another key than {}: the files are from two certifications. Next: use both files of one `veris fleet-key certify --out DIR`",
                cert_path.display(),
                dir.join(IDENTITY_KEY).display()
            );
        }
        if let Some(t) = cert.not_after_ms.filter(|t| now_ms() > *t) {
            bail!(
                "the identity certificate in {} expired (not after unix ms {t}). Next: certify a new one (veris fleet-key certify --gateway {gateway})",
                dir.display()
            );
        }
        Ok(Identity { key, cert })
    }

    /// The bucket entry certifying `seal` for this run, started now.
    fn entry(&self, seal: &Sealer) -> KeyEntry {
        KeyEntry {
            identity: self.cert.clone(),
            seal: SealKeyCert::issue(&self.key, &self.cert.gateway, &seal.public_key(), now_ms()),
        }
    }
}

/// Stores this run's certified seal key in the key bucket, retrying (a
/// NATS server that is down delays nothing) until written or `cancel`.
pub fn publish(
    fleet: &veris_fleet::Fleet,
    identity: &Identity,
    seal: &Arc<Sealer>,
    cancel: CancellationToken,
) -> Result<()> {
    let bucket = Registry::named(
        fleet,
        KEYS_BUCKET,
        "veris gateways' seal keys: key = <gateway>.<seal key fingerprint>, value = its certificates",
    )?;
    let key = entry_key(&identity.cert.gateway, seal.key_id());
    let value = bytes::Bytes::from(serde_json::to_vec(&identity.entry(seal))?);
    tokio::spawn(async move {
        let mut attempt = 0u32;
        loop {
            match bucket.put_at(&key, value.clone(), 0).await {
                Ok(_) => {
                    info!(bucket = KEYS_BUCKET, key = %key, "this run's seal key is certified in the fleet's key bucket");
                    return;
                }
                // Written before, its answer lost: done too.
                Err(_) if matches!(bucket.current(&key).await, Ok(c) if c.value.as_ref() == Some(&value)) => {
                    return
                }
                Err(e) => {
                    if attempt == 0 {
                        warn!(error = %e, "the fleet's key bucket is not written yet: readers pinning the operator key cannot verify this run until it is; retrying");
                    }
                }
            }
            attempt = attempt.saturating_add(1);
            let wait = Duration::from_millis((100u64 << attempt.min(5)).min(2000));
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    });
    Ok(())
}
