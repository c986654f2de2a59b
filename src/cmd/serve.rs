//! `veris serve`: the stack until SIGINT or SIGTERM, then its final seal.

use anyhow::Result;
use tracing::info;

use crate::runtime::stack::{Role, ServeArgs, Stack};

/// `veris serve`: runs until SIGINT or SIGTERM.
pub async fn serve(args: ServeArgs) -> Result<u8> {
    // Before anything is announced: a SIGTERM that arrives right after the
    // ready file must end the session cleanly (final seal, admin files
    // removed), never by the default action.
    let signals = Signals::install()?;
    let stack = Stack::start(
        &args,
        veris_proxy::config::DEFAULT_LISTEN,
        Role::Serve,
        crate::tier::for_serve(&args.transparent),
    )
    .await?;
    crate::logging::announce(&format!(
        "proxy {} (sandbox {}, twin {}); CA {}",
        stack.proxy_url,
        stack.identity.sandbox_id,
        stack.twin_base,
        stack.trust.ca_pem.display()
    ));
    for line in &stack.webhooks_described {
        crate::logging::announce(line);
    }
    // Announced like the proxy URL: the app needs its signing secret.
    for (name, value) in &stack.webhook_env {
        crate::logging::announce(&format!("{name}={value}"));
    }
    if let Some(line) = &stack.ingress_described {
        crate::logging::announce(line);
    }
    crate::outln!("{}", stack.proxy_url);
    // The ready file is written: the listeners accept.
    crate::os::notify::ready();
    signals.wait().await;
    crate::os::notify::stopping();
    info!("shutting down");
    let finished = stack.finish().await?;
    if let Some(seal) = &finished.seal {
        info!(seq = seal.seq, key_id = %finished.key_id, "final seal written");
    }
    Ok(0)
}

/// SIGTERM and SIGINT, caught from the moment they are installed.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
