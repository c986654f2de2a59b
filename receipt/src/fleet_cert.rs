//! Certificates of a fleet's seal keys (DESIGN §14, G2). Every gateway
//! seals with a fresh key at each start ([`Sealer::generate`]), so a reader
//! who pins seal keys must learn a new one after every restart. Instead:
//!
//! - an **operator key**, kept offline, certifies each gateway's
//!   **identity key** ([`IdentityCert`]: the gateway's name, the identity
//!   key, when it was issued and, optionally, until when it is valid);
//! - at each start the gateway certifies that run's seal key with its
//!   identity key ([`SealKeyCert`]: the gateway's name, the seal key, when
//!   the run started) and stores both certificates ([`KeyEntry`]) in the
//!   fleet's key bucket;
//! - a reader pins the operator key's fingerprint (`veris receipt
//!   --fleet-key`); a seal key counts as pinned for gateway G's chain only
//!   when [`KeyEntry::certifies`] says so: both signatures verify, both
//!   certificates name G, the seal-key certificate names that exact key.
//!
//! The bucket is storage, like `ledger.pub` (DESIGN §7a.1): anyone who can
//! write it can put anything there, so nothing in an entry is believed
//! but what the pinned operator key's signature vouches for. The signed
//! texts start with their own prefix, so no signature of one kind (or a
//! seal's, `veris-seal-v…`) reads as another.

use serde::{Deserialize, Serialize};

use crate::seal::{PublicKey, PublicKeys, Sealer};

/// What an identity certificate's signature covers, before its fields.
const IDENTITY_TEXT: &str = "veris-gateway-identity-v1";
/// What a seal-key certificate's signature covers, before its fields.
const SEAL_KEY_TEXT: &str = "veris-gateway-seal-key-v1";
/// Largest bucket entry read (two certificates are under 1 KiB).
pub const MAX_ENTRY: usize = 16 * 1024;

/// A gateway's identity key, certified by the operator key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityCert {
    /// The gateway's name: its NATS subject token (`--nats-name`).
    pub gateway: String,
    /// The identity key, raw, hex.
    pub identity_key: String,
    /// Unix ms it was issued.
    pub issued_ms: u64,
    /// Unix ms after which it certifies nothing (none: no end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after_ms: Option<u64>,
    /// The operator key that signed it, raw, hex: a reader selects it by
    /// its pinned fingerprint, never takes it on the entry's word.
    pub operator_key: String,
    /// Hex Ed25519 signature by the operator key over [`Self::text`].
    pub signature: String,
}

impl IdentityCert {
    fn text(&self) -> String {
        let until = self
            .not_after_ms
            .map_or_else(|| "-".to_string(), |t| t.to_string());
        format!(
            "{IDENTITY_TEXT} {} {} {} {until} {}",
            self.gateway, self.identity_key, self.issued_ms, self.operator_key
        )
    }

    /// `identity` certified as `gateway`'s by `operator`.
    pub fn issue(
        operator: &Sealer,
        gateway: &str,
        identity: &PublicKey,
        issued_ms: u64,
        not_after_ms: Option<u64>,
    ) -> IdentityCert {
        let mut cert = IdentityCert {
            gateway: gateway.to_string(),
            identity_key: crate::hash::hex(&identity.raw),
            issued_ms,
            not_after_ms,
            operator_key: operator.public_key_hex(),
            signature: String::new(),
        };
        cert.signature = operator.sign_text(&cert.text());
        cert
    }

    /// The identity key it names, if it is one.
    pub fn identity(&self) -> Option<PublicKey> {
        PublicKeys::from_hex(&self.identity_key)
    }
}

/// One run's seal key, certified by the gateway's identity key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealKeyCert {
    pub gateway: String,
    /// The run's seal key, raw, hex.
    pub seal_key: String,
    /// Unix ms the run started.
    pub started_ms: u64,
    /// Hex Ed25519 signature by the identity key over [`Self::text`].
    pub signature: String,
}

impl SealKeyCert {
    fn text(&self) -> String {
        format!(
            "{SEAL_KEY_TEXT} {} {} {}",
            self.gateway, self.seal_key, self.started_ms
        )
    }

    /// `seal` certified as `gateway`'s run's by its identity key.
    pub fn issue(identity: &Sealer, gateway: &str, seal: &PublicKey, started_ms: u64) -> Self {
        let mut cert = SealKeyCert {
            gateway: gateway.to_string(),
            seal_key: crate::hash::hex(&seal.raw),
            started_ms,
            signature: String::new(),
        };
        cert.signature = identity.sign_text(&cert.text());
        cert
    }
}

/// A bucket entry: both links from the operator key to one seal key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub identity: IdentityCert,
    pub seal: SealKeyCert,
}

/// The bucket key of `gateway`'s seal key `seal_fingerprint`.
pub fn entry_key(gateway: &str, seal_fingerprint: &str) -> String {
    format!("{gateway}.{seal_fingerprint}")
}

impl KeyEntry {
    /// The seal key (fingerprint `seal_fp`) this entry certifies for the
    /// chain of `gateway`, if every link holds: the identity certificate
    /// is signed by an operator key whose fingerprint is in `operators`,
    /// names `gateway` and is valid at `now_ms`; the seal-key certificate
    /// is signed by that identity key, names `gateway`, names exactly the
    /// key `seal_fp` and a start within the identity's validity. Else
    /// which link failed, in words.
    pub fn certifies(
        bytes: &[u8],
        operators: &[String],
        gateway: &str,
        seal_fp: &str,
        now_ms: u64,
    ) -> Result<PublicKey, String> {
        if bytes.len() > MAX_ENTRY {
            return Err(format!(
                "the entry is {} bytes, over {MAX_ENTRY}: not a certificate pair",
                bytes.len()
            ));
        }
        let e: KeyEntry = serde_json::from_slice(bytes).map_err(|e| {
            format!("the entry is not a certificate pair (a bare key, or garbled): {e}")
        })?;
        let id = &e.identity;
        let operator = PublicKeys::from_hex(&id.operator_key)
            .ok_or("the identity certificate names no Ed25519 operator key")?;
        if !operators.contains(&operator.key_id) {
            return Err(format!(
                "the identity certificate is signed by operator key {}, not the pinned one",
                operator.key_id
            ));
        }
        if !operator.verifies(&id.text(), &id.signature) {
            return Err(
                "the identity certificate's signature does not verify under the pinned operator key: it was altered".into(),
            );
        }
        if id.gateway != gateway {
            return Err(format!(
                "the identity certificate is gateway {:?}'s, not {gateway:?}'s (whose subject the chain is on)",
                id.gateway
            ));
        }
        if let Some(t) = id.not_after_ms.filter(|t| now_ms > *t) {
            return Err(format!(
                "the identity certificate expired (not after unix ms {t}). Next: certify a new identity key for {gateway} (veris fleet-key certify)"
            ));
        }
        let identity = id
            .identity()
            .ok_or("the identity certificate names no Ed25519 identity key")?;
        let s = &e.seal;
        if !identity.verifies(&s.text(), &s.signature) {
            return Err(format!(
                "the seal-key certificate does not verify under {gateway}'s certified identity key"
            ));
        }
        if s.gateway != gateway {
            return Err(format!(
                "the seal-key certificate names gateway {:?}, not {gateway:?}",
                s.gateway
            ));
        }
        let seal = PublicKeys::from_hex(&s.seal_key)
            .ok_or("the seal-key certificate names no Ed25519 key")?;
        if seal.key_id != seal_fp {
            return Err(format!(
                "the seal-key certificate is for key {}, not {seal_fp}",
                seal.key_id
            ));
        }
        if s.started_ms < id.issued_ms || id.not_after_ms.is_some_and(|t| s.started_ms > t) {
            return Err(
                "the seal-key certificate's start lies outside the identity certificate's validity"
                    .into(),
            );
        }
        Ok(seal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Sealer {
        Sealer::generate_pkcs8().unwrap().0
    }

    fn entry(op: &Sealer, id: &Sealer, name: &str, seal: &Sealer) -> Vec<u8> {
        serde_json::to_vec(&KeyEntry {
            identity: IdentityCert::issue(op, name, &id.public_key(), 1000, None),
            seal: SealKeyCert::issue(id, name, &seal.public_key(), 2000),
        })
        .unwrap()
    }

    #[test]
    fn a_seal_key_is_certified_only_through_both_links() {
        let (op, other_op, id, seal) = (key(), key(), key(), key());
        let ops = vec![op.key_id().to_string()];
        let fp = seal.key_id();
        let good = entry(&op, &id, "gw1", &seal);
        let k = KeyEntry::certifies(&good, &ops, "gw1", fp, 3000).unwrap();
        assert_eq!(k, seal.public_key());
        // Another operator, another gateway's subject, another key.
        let e = KeyEntry::certifies(&entry(&other_op, &id, "gw1", &seal), &ops, "gw1", fp, 3000);
        assert!(e.unwrap_err().contains("not the pinned one"));
        let e = KeyEntry::certifies(&good, &ops, "gw2", fp, 3000).unwrap_err();
        assert!(e.contains("not \"gw2\"'s"), "{e}");
        let e = KeyEntry::certifies(&good, &ops, "gw1", key().key_id(), 3000).unwrap_err();
        assert!(e.contains("is for key"), "{e}");
        // A bare key, garbage, an altered field.
        let bare = format!("ed25519 {}", seal.public_key_hex());
        let e = KeyEntry::certifies(bare.as_bytes(), &ops, "gw1", fp, 3000).unwrap_err();
        assert!(e.contains("not a certificate pair"), "{e}");
        let mut v: KeyEntry = serde_json::from_slice(&good).unwrap();
        v.identity.gateway = "gw2".into();
        let altered = serde_json::to_vec(&v).unwrap();
        let e = KeyEntry::certifies(&altered, &ops, "gw2", fp, 3000).unwrap_err();
        assert!(e.contains("altered"), "{e}");
        // The identity key signs nothing but its own certificate's named key.
        let mut v: KeyEntry = serde_json::from_slice(&good).unwrap();
        v.seal.seal_key = key().public_key_hex();
        let e = KeyEntry::certifies(&serde_json::to_vec(&v).unwrap(), &ops, "gw1", fp, 3000);
        assert!(e.unwrap_err().contains("does not verify"));
    }

    #[test]
    fn an_expired_identity_certifies_nothing() {
        let (op, id, seal) = (key(), key(), key());
        let ops = vec![op.key_id().to_string()];
        let e = KeyEntry {
            identity: IdentityCert::issue(&op, "gw1", &id.public_key(), 1000, Some(5000)),
            seal: SealKeyCert::issue(&id, "gw1", &seal.public_key(), 2000),
        };
        let bytes = serde_json::to_vec(&e).unwrap();
        assert!(KeyEntry::certifies(&bytes, &ops, "gw1", seal.key_id(), 4000).is_ok());
        let why = KeyEntry::certifies(&bytes, &ops, "gw1", seal.key_id(), 6000).unwrap_err();
        assert!(why.contains("expired"), "{why}");
    }
}
