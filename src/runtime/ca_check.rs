//! What every start checks of the CA it loaded: that it may sign for each
//! name this start mints leaves for (a route outside its name constraints
//! is refused with the fix, never met by a silently regenerated CA, since
//! every client trusting the CA file would have to be given the new one),
//! and what to say of a CA without constraints or close to its end.

use std::path::Path;

use anyhow::{bail, Result};
use tracing::warn;
use veris_ca::CertificateAuthority;

/// Refuses a start whose `needed` names (routed hosts, the canary, the
/// gateway's TLS names) are outside `ca`'s name constraints; warns of an
/// unconstrained CA and of one that expires within 30 days.
pub fn check(ca: &CertificateAuthority, ca_dir: &Path, needed: &[String]) -> Result<()> {
    let outside: Vec<&str> = needed
        .iter()
        .map(String::as_str)
        .filter(|n| !ca.permits(n))
        .collect();
    if !outside.is_empty() {
        bail!(
            "the CA in {1} may not sign for {0}: its name constraints permit only {2}. Next: `veris ca rotate --ca-dir {3}` with this start's --config or --route flags (--name for other names) makes a CA that permits them; clients must then trust the new {4}",
            outside.join(", "),
            ca_dir.display(),
            ca.scope().map(|s| s.subtrees().join(", ")).unwrap_or_default(),
            ca_dir.display(),
            ca.cert_path().display(),
        );
    }
    if ca.scope().is_none() {
        warn!(
            dir = %ca_dir.display(),
            "the CA is unconstrained (made before veris constrained its CAs): it can sign for any name, so whoever copies its key can intercept anything that trusts it. Next: `veris ca rotate --ca-dir {}` makes one that can sign only for the routed vendors (then give clients the new CA file)",
            ca_dir.display()
        );
    }
    if ca.expires_soon() {
        warn!(
            dir = %ca_dir.display(),
            not_after = %ca.not_after(),
            "the CA expires within 30 days; after that serve and run refuse it. Next: `veris ca rotate --ca-dir {}` makes the next one now (then give clients the new CA file)",
            ca_dir.display()
        );
    }
    Ok(())
}
