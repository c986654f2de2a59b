//! The confined tier: the explicit tier, with the command's TCP connects
//! confined to the proxy's port by Landlock (`veris __confine`,
//! [`crate::os::landlock`]). It binds nothing of its own.

use anyhow::{Context, Result};
use futures_util::future::BoxFuture;

use super::{Bound, Ran, Tier, Workload};

/// The confined tier: the explicit tier's child behind `veris __confine`.
pub struct Confined;

impl Tier for Confined {
    fn bind(&mut self) -> BoxFuture<'_, Result<Bound>> {
        Box::pin(async {
            Ok(Bound {
                coverage: Some(coverage()),
                ..Bound::default()
            })
        })
    }

    fn run<'a>(&'a mut self, w: Workload<'a>) -> BoxFuture<'a, Result<Ran>> {
        Box::pin(async move {
            let command = wrap(w.command.to_vec(), w.proxy_addr.port())?;
            let code =
                super::explicit::run(&command, super::explicit::vars(&w), w.file_limit).await?;
            Ok(Ran { code, canary: None })
        })
    }
}

/// `command` behind `veris __confine`, allowed TCP connects to `proxy_port` only.
pub fn wrap(mut command: Vec<String>, proxy_port: u16) -> Result<Vec<String>> {
    let exe = std::env::current_exe().context("finding the veris binary")?;
    let mut wrapped = vec![
        exe.to_string_lossy().into_owned(),
        "__confine".into(),
        "--allow-port".into(),
        proxy_port.to_string(),
        "--".into(),
    ];
    wrapped.append(&mut command);
    Ok(wrapped)
}

/// What Landlock's confinement of an explicit-tier child covers: TCP only
/// (to the proxy's port); UDP and ICMP are not its business.
pub fn coverage() -> veris_receipt::Coverage {
    veris_receipt::Coverage {
        tcp_ports: None,
        quic: "open".into(),
        dns: "open".into(),
        udp_other: "open".into(),
        ip_other: "open".into(),
        ipv6: true,
        exempt: Vec::new(),
        installed_by: "veris".into(),
        isolation: Some("landlock".into()),
        sockets_reachable: Vec::new(),
        bundles: Vec::new(),
        upstream_proxy: false,
    }
}
