//! What a start announces: `--write-env` and `--ready-file`, and the
//! `NO_PROXY` clients get.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result};
use tracing::warn;
use veris_ca::env::EnvSpec;
use veris_ca::trust::TrustFiles;
use veris_proxy::Identity;
use veris_receipt::ledger::Ledger;

use super::*;

/// What `--write-env` and `--ready-file` announce.
pub(super) struct Announce<'a> {
    pub(super) proxy_url: &'a str,
    pub(super) identity: &'a Identity,
    pub(super) twin_base: &'a str,
    pub(super) state_dir: &'a Path,
    pub(super) ledger: &'a Ledger,
    pub(super) trust: &'a TrustFiles,
    pub(super) routed_hosts: &'a [String],
    pub(super) admin: Option<SocketAddr>,
    pub(super) key_id: &'a str,
    pub(super) transparent: Option<(SocketAddr, SocketAddr)>,
    /// The webhook secrets' variables (`STRIPE_WEBHOOK_SECRET`).
    pub(super) webhook_env: &'a [(String, String)],
}

impl Announce<'_> {
    /// `--write-env` (the workload, maybe another uid, must source it; its
    /// one secret is a webhook signing secret, which is the app's to know),
    /// then `--ready-file`, last.
    pub(super) fn write(&self, args: &ServeArgs) -> Result<()> {
        if let Some(path) = &args.write_env {
            // The workload sources the file in an environment like this
            // one: its NO_PROXY is merged in (minus entries that would
            // exempt a routed host); JAVA_TOOL_OPTIONS and PHP_INI_SCAN_DIR
            // are the workload's own business, so nothing is appended to.
            let no_proxy = if args.env_trust_only {
                Vec::new()
            } else {
                merged_no_proxy(self.routed_hosts)
            };
            let spec = EnvSpec {
                proxy_url: self.proxy_url,
                no_proxy: &no_proxy,
                sandbox_id: &self.identity.sandbox_id,
                canary: &self.identity.canary,
                trust: self.trust,
                trust_only: args.env_trust_only,
                java_tool_options_base: None,
                php_ini_scan_dir_base: None,
                extra: self.webhook_env,
            };
            veris_ca::env::write(path, &spec, args.env_format.into()).with_context(|| {
                format!(
                    "writing env file {}. Next: name a file in a directory veris can write",
                    path.display()
                )
            })?;
        }
        if let Some(path) = &args.ready_file {
            let ready = serde_json::json!({
                "proxy_url": self.proxy_url,
                "pid": std::process::id(),
                "sandbox_id": self.identity.sandbox_id,
                "twin": self.twin_base,
                "state_dir": self.state_dir,
                "ledger": self.ledger.path(),
                "ca": self.trust.ca_pem,
                "admin": self.admin.map(|a| format!("http://{a}")),
                "key_id": self.key_id,
                "https_listen": self.transparent.map(|a| a.0.to_string()),
                "http_listen": self.transparent.map(|a| a.1.to_string()),
            });
            // 0644: no secret in it (the admin token stays in its own file).
            veris_ca::fsutil::write_file(path, format!("{ready}\n").as_bytes(), 0o644)
                .with_context(|| {
                    format!(
                        "writing ready file {}. Next: name a file in a directory veris can write",
                        path.display()
                    )
                })?;
        }
        Ok(())
    }
}

/// Hosts clients must reach directly.
pub fn no_proxy() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into(), "::1".into()]
}

/// The values of this process's environment that the client variables
/// append to rather than replace.
#[derive(Debug, Default, Clone)]
pub struct EnvBase {
    pub java_tool_options: Option<String>,
    pub php_ini_scan_dir: Option<String>,
}

impl EnvBase {
    pub fn from_env() -> EnvBase {
        EnvBase {
            java_tool_options: std::env::var("JAVA_TOOL_OPTIONS").ok(),
            php_ini_scan_dir: std::env::var("PHP_INI_SCAN_DIR").ok(),
        }
    }
}

/// veris's `NO_PROXY` with the user's (`NO_PROXY` and `no_proxy` of this
/// process) merged in: the union, each entry once. An entry that would
/// exempt a routed host (`*`, `.stripe.com`) is dropped with a warning on
/// stderr: a client honouring it would call the vendor directly, unseen.
pub fn merged_no_proxy(routed_hosts: &[String]) -> Vec<String> {
    let user: Vec<String> = ["NO_PROXY", "no_proxy"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .collect();
    let user: Vec<&str> = user.iter().map(String::as_str).collect();
    let merged = veris_ca::env::merge_no_proxy(&no_proxy(), &user, routed_hosts);
    for (entry, pattern) in &merged.dropped {
        warn!(
            "ignoring a NO_PROXY entry {entry:?}: it would send {pattern} (routed to the twin) around the proxy, and the receipt would miss those calls. Next: take it out of NO_PROXY (veris keeps the rest)"
        );
    }
    merged.entries
}
