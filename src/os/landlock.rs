//! Landlock network confinement: the fallback of `veris run` where no network
//! namespace can be had (no unprivileged user namespaces). The child then runs
//! in the explicit tier (`HTTPS_PROXY=http://127.0.0.1:PORT`), and this module
//! makes the kernel refuse any TCP `connect()` to another port with `EACCES`,
//! so a client that ignores `HTTPS_PROXY` fails loudly instead of leaving
//! unseen. It is applied by the hidden `veris __confine` command, in a fresh
//! single-threaded process right before it execs the workload, so the rules
//! bind the workload and everything it forks or execs, and cannot be lifted.
//!
//! What it does not cover, and the receipt must say so:
//! - Landlock matches TCP ports only, never addresses: a connect to ANY host on
//!   an allowed port is permitted (port 443 allowed means every host's 443).
//! - UDP is not covered by the network rules this module handles (ABI 4 to 9
//!   have none), so QUIC and DNS still go out: the receipt names
//!   `udp-quic-possible`. Other socket families (Unix sockets, raw sockets
//!   where permitted) are untouched as well.
//! - Only `connect()` is handled: `bind()` and `listen()` stay unrestricted,
//!   so clients may serve on loopback; filesystem access is not restricted.
//! - Two TCP paths skip Landlock's connect hook (known upstream, open in
//!   landlock-lsm/linux issues 41 and 54, and seen on Linux 6.18): a first
//!   `sendto(..., MSG_FASTOPEN, addr)` on an unconnected TCP socket, and a
//!   Multipath TCP socket (`IPPROTO_MPTCP`, where `net.mptcp.enabled` is 1).
//!   Only code written to use them gets through; `TCP_FASTOPEN_CONNECT` with
//!   `connect()` (curl `--tcp-fastopen`) is refused like any connect.
//!
//! Nothing is ever confined halfway: [`confine_connect`] fails unless the
//! kernel enforces the network rules fully (ABI 4, Linux 6.7, or later).

// Unsafe: the one raw landlock_create_ruleset syscall (see `probe`).
#![allow(unsafe_code)]

use anyhow::{bail, Context, Result};
use landlock::{
    AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetError, RulesetStatus,
};

/// The first Landlock ABI with TCP network rules (Linux 6.7).
pub const MIN_ABI: u32 = 4;

/// What the kernel answered when asked for its Landlock ABI version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// The ABI version the kernel enforces.
    Abi(u32),
    /// `ENOSYS`: not built into the kernel, or a seccomp filter answering for it.
    NotImplemented,
    /// `EOPNOTSUPP`: built in, but not enabled at boot.
    NotEnabled,
    /// Any other errno, e.g. `EPERM` from a seccomp filter.
    Refused(i32),
}

/// Asks the kernel: `landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`.
///
/// The landlock crate keeps its own probe private (it wants callers to ask
/// for rights, not versions), and the ABI number is what the receipt and the
/// tier decision report, so this is the one raw syscall of this module.
fn probe() -> Probe {
    // The flag's value in <linux/landlock.h>; libc does not export it.
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attribute pointer and size 0 the kernel reads no
    // memory; this flag only returns the ABI version (or an errno).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if rc >= 0 {
        return Probe::Abi(u32::try_from(rc).unwrap_or(u32::MAX));
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENOSYS) => Probe::NotImplemented,
        Some(libc::EOPNOTSUPP) => Probe::NotEnabled,
        Some(errno) => Probe::Refused(errno),
        None => Probe::Refused(0),
    }
}

/// The Landlock ABI version this kernel enforces, or None (not built in,
/// disabled, or blocked by seccomp).
pub fn abi() -> Option<u32> {
    match probe() {
        Probe::Abi(v) => Some(v),
        _ => None,
    }
}

/// Why confinement is unavailable here, in one sentence with a next step, or
/// None when it works (ABI >= 4).
pub fn unavailable() -> Option<String> {
    reason(probe())
}

/// The gate behind [`unavailable`], on a given probe result.
fn reason(probe: Probe) -> Option<String> {
    const NEXT: &str =
        "or allow unprivileged user namespaces so `veris run` can use a network namespace instead";
    match probe {
        Probe::Abi(v) if v >= MIN_ABI => None,
        Probe::Abi(v) => Some(format!(
            "this kernel's Landlock is ABI {v} and network rules need ABI {MIN_ABI} (Linux 6.7): \
             run on Linux 6.7 or later, {NEXT}"
        )),
        Probe::NotImplemented => Some(format!(
            "Landlock is not available (ENOSYS: not built into this kernel, or blocked by a \
             seccomp filter): allow the landlock_* syscalls in the container's seccomp profile \
             or run on a kernel built with CONFIG_SECURITY_LANDLOCK, {NEXT}"
        )),
        Probe::NotEnabled => Some(format!(
            "Landlock is built into this kernel but not enabled at boot: add `landlock` to the \
             `lsm=` kernel parameter, {NEXT}"
        )),
        Probe::Refused(errno) => Some(format!(
            "the Landlock probe was refused ({}), most likely by a seccomp filter: allow the \
             landlock_* syscalls in the container's seccomp profile, {NEXT}",
            std::io::Error::from_raw_os_error(errno)
        )),
    }
}

/// Confines THIS process (call it in a fresh single-threaded process right
/// before exec): TCP connect() only to `allowed_ports`, TCP bind()
/// unrestricted (clients may listen locally), no_new_privs set. Returns an
/// error unless the kernel enforces the network rules fully (ABI >= 4 and
/// `RulesetStatus::FullyEnforced` for the net access rights) — never a silent
/// partial confinement.
pub fn confine_connect(allowed_ports: &[u16]) -> Result<()> {
    if let Some(why) = unavailable() {
        bail!("{why}");
    }
    // Only ConnectTcp is handled, so bind, UDP and the filesystem are left
    // alone; HardRequirement turns any unsupported part into an error instead
    // of the crate's default best effort.
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessNet::ConnectTcp)
        .context("declaring the Landlock TCP connect right")?
        .create()
        .context("creating the Landlock ruleset")?
        .no_new_privs(true)
        .add_rules(
            allowed_ports
                .iter()
                .map(|&port| Ok::<_, RulesetError>(NetPort::new(port, AccessNet::ConnectTcp))),
        )
        .context("adding the allowed ports to the Landlock ruleset")?
        .restrict_self()
        .context("enforcing the Landlock ruleset")?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        bail!(
            "the kernel (Landlock ABI {}) enforced the network rules only as {:?}: \
             run on Linux 6.7 or later with Landlock enabled",
            abi().map_or_else(|| "unknown".to_string(), |v| v.to_string()),
            status.ruleset
        );
    }
    if !status.no_new_privs {
        bail!("no_new_privs could not be set, so the command could regain privileges: check the seccomp profile");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_four_and_later_is_available() {
        for v in [4, 5, 7, 42] {
            assert_eq!(reason(Probe::Abi(v)), None, "ABI {v}");
        }
    }

    #[test]
    fn abi_below_four_is_refused_with_the_version() {
        for v in [0, 1, 3] {
            let why = reason(Probe::Abi(v)).expect("refused");
            assert!(why.contains(&format!("ABI {v}")), "{why}");
            assert!(why.contains("ABI 4"), "{why}");
            assert!(why.contains("Linux 6.7"), "{why}");
        }
    }

    #[test]
    fn every_refusal_is_one_sentence_with_a_next_step() {
        let probes = [
            Probe::Abi(3),
            Probe::NotImplemented,
            Probe::NotEnabled,
            Probe::Refused(libc::EPERM),
        ];
        for p in probes {
            let why = reason(p).expect("refused");
            assert!(why.contains(": "), "a cause, then what to do: {why}");
            assert!(why.contains("network namespace"), "{why}");
            assert!(!why.contains(". "), "one sentence: {why}");
            assert!(!why.ends_with('.'), "{why}");
        }
        assert!(reason(Probe::NotImplemented).unwrap().contains("ENOSYS"));
        assert!(reason(Probe::NotEnabled).unwrap().contains("lsm="));
        assert!(reason(Probe::Refused(libc::EPERM))
            .unwrap()
            .contains("Operation not permitted"));
    }

    #[test]
    fn abi_matches_the_gate_on_this_kernel() {
        // Whatever this machine has, abi() and unavailable() must agree.
        match abi() {
            Some(v) if v >= MIN_ABI => assert_eq!(unavailable(), None),
            _ => assert!(unavailable().is_some()),
        }
    }
}
