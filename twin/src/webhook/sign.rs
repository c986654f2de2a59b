//! Stripe's webhook signature: `Stripe-Signature: t=<unix>,v1=<hex>`, each
//! `v1` the HMAC-SHA256 keyed by a whole `whsec_…` secret over
//! `"<t>.<payload>"`; during a secret rotation one `v1` per secret, as
//! Stripe sends them. Stripe's SDKs accept a signature whose `t` is within
//! 300 s of their clock.

use aws_lc_rs::hmac;

/// The header Stripe's signature travels in.
pub const SIGNATURE_HEADER: &str = "stripe-signature";

/// A webhook signing secret (`whsec_` + 32 random bytes in hex), made per
/// run. Its `Debug` never shows it: it must not reach a log.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl Secret {
    /// A fresh secret from the system's random source.
    pub fn generate() -> Result<Secret, aws_lc_rs::error::Unspecified> {
        let mut bytes = [0u8; 32];
        aws_lc_rs::rand::fill(&mut bytes)?;
        let mut s = String::with_capacity(6 + 64);
        s.push_str("whsec_");
        for b in bytes {
            s.push_str(&format!("{b:02x}"));
        }
        Ok(Secret(s))
    }

    /// A secret given as text (a test vector, a secret the user chose).
    pub fn from_text(text: &str) -> Secret {
        Secret(text.to_string())
    }

    /// The secret as the app is given it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// The `Stripe-Signature` value for `payload` sent at unix time `t`, one
/// `v1` per secret (the new one first during a rotation).
pub fn stripe_signature(secrets: &[Secret], t: i64, payload: &[u8]) -> String {
    let mut out = format!("t={t}");
    for secret in secrets {
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret.0.as_bytes());
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(t.to_string().as_bytes());
        ctx.update(b".");
        ctx.update(payload);
        out.push_str(",v1=");
        for b in ctx.sign().as_ref() {
            out.push_str(&format!("{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors from Python:
    /// `hmac.new(b"whsec_test_secret", b'1700000000.{"id":"evt_1"}', hashlib.sha256).hexdigest()`
    /// and the same keyed by `whsec_old`.
    #[test]
    fn signs_as_stripe_does() {
        let payload = br#"{"id":"evt_1"}"#;
        let new = Secret::from_text("whsec_test_secret");
        assert_eq!(
            stripe_signature(std::slice::from_ref(&new), 1_700_000_000, payload),
            "t=1700000000,v1=248a374f50f943a28b0f6ab50faf9a7e7e29b710fa26df9fb1618b9bf8ea9c9a"
        );
        let old = Secret::from_text("whsec_old");
        assert_eq!(
            stripe_signature(&[new, old], 1_700_000_000, payload),
            "t=1700000000,v1=248a374f50f943a28b0f6ab50faf9a7e7e29b710fa26df9fb1618b9bf8ea9c9a,\
             v1=ef1b1b7e4b312671a75ef2a03e10529f7834a6528a49db77ad6568c8c8017843"
        );
    }

    #[test]
    fn secrets_are_fresh_and_never_debug_printed() {
        let a = Secret::generate().expect("random");
        let b = Secret::generate().expect("random");
        assert_ne!(a, b);
        assert!(a.expose().starts_with("whsec_") && a.expose().len() == 70);
        assert!(!format!("{a:?}").contains(a.expose()));
    }
}
