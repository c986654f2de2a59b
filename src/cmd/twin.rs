//! `veris twin`: the built-in twin on its own.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use veris_ca::{CertificateAuthority, Issuer};
use veris_twin::{Fixtures, Twin, TwinOptions};

#[derive(Args, Debug)]
pub struct TwinArgs {
    /// Listen address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Serve only this sandbox id (others get 404).
    #[arg(long, value_name = "ID")]
    pub sandbox: Option<String>,
    /// Fixture file added to the built-in fixtures (same method and path: the file wins).
    #[arg(long, value_name = "FILE")]
    pub fixtures: Option<PathBuf>,
    /// Append every request row to this JSONL file and reload it on start.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// Serve TLS (h2 and http/1.1 by ALPN) with a leaf from the veris CA.
    #[arg(long)]
    pub tls: bool,
    /// State dir holding the CA (with --tls).
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Answer vendor requests only when they carry `Authorization: Bearer
    /// <value of VAR>` (give the proxy the same VAR as `upstream.auth_value_env`);
    /// others get 401 and no log row. The value is never printed.
    #[arg(long, value_name = "VAR")]
    pub credential_env: Option<String>,
}

pub async fn twin(args: TwinArgs) -> Result<u8> {
    let mut fixtures = Fixtures::builtin();
    if let Some(path) = &args.fixtures {
        fixtures.extend(
            Fixtures::load(path).with_context(|| format!("loading fixtures {}", path.display()))?,
        );
    }
    let credential = args
        .credential_env
        .as_deref()
        .map(credential_from_env)
        .transpose()?;
    let twin = Twin::new(TwinOptions {
        fixtures,
        sandbox: args.sandbox.clone(),
        log: args.log.clone(),
        credential,
    })?;
    // The request log is a file others read: no key in a path reaches it.
    twin.redact_paths_with(veris_receipt::redact::text);
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| {
            format!(
                "binding the twin to {}. Next: pick another --listen",
                args.listen
            )
        })?;
    let addr = listener.local_addr()?;
    let tls = if args.tls {
        let state = crate::util::state_dir(args.state_dir.clone());
        let scope =
            veris_proxy::scope::scope(None, &[]).context("the names the CA may sign for")?;
        let (ca, _) = CertificateAuthority::load_or_create(&state.join("ca"), &scope)
            .context("loading the CA")?;
        let issuer = Issuer::new(Arc::new(ca), 16);
        let host = addr.ip().to_string();
        // The CA signs for loopback addresses; another one needs `veris ca rotate --name`.
        let key = issuer
            .certified_key(&host)
            .with_context(|| format!("minting the twin's TLS certificate for {host}"))?;
        Some(veris_proxy::inbound::tls::server_config(key))
    } else {
        None
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    {
        // First stdout line: the URL, for scripts.
        let mut out = std::io::stdout().lock();
        writeln!(out, "{scheme}://{addr}")?;
        out.flush()?;
    }
    let shutdown = async {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
    };
    veris_twin::serve(listener, twin, tls, shutdown).await?;
    Ok(0)
}

/// The twin credential from `var`. Errors name the variable, never its value.
fn credential_from_env(var: &str) -> Result<String> {
    let value = std::env::var(var).map_err(|e| {
        anyhow::anyhow!(
            "--credential-env names {var}, which is {}. Next: export {var}=<a long random secret> \
             and give the proxy the same variable (upstream.auth_value_env)",
            match e {
                std::env::VarError::NotPresent => "not set",
                std::env::VarError::NotUnicode(_) => "not valid UTF-8",
            }
        )
    })?;
    // The proxy sends the same bytes in a header value (`Bearer <value>`), not
    // trimmed: visible ASCII only, so both sides agree on what the secret is.
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_graphic()) {
        anyhow::bail!(
            "{var} must be a non-empty token of visible ASCII characters (no spaces or newlines). \
             Next: export {var}=$(openssl rand -hex 32)"
        );
    }
    Ok(value)
}
