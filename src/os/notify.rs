//! systemd's readiness protocol (`sd_notify(3)`): `READY=1` once serve or
//! the gateway accepts connections, `STOPPING=1` when it begins to stop.
//!
//! The socket is taken out of the environment at the start of `main`, while
//! the process is still single-threaded, so no child — above all the
//! workload of `veris run` — inherits `NOTIFY_SOCKET` and speaks for veris
//! (`NotifyAccess=all` would believe it). That is why the protocol is here
//! by hand: the `sd-notify` crate reads the variable at each call, so it
//! would have to stay in the environment until `READY=1`.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;

static SOCKET: OnceLock<Option<std::ffi::OsString>> = OnceLock::new();

/// Removes `NOTIFY_SOCKET` from the environment and keeps it for
/// [`ready`] and [`stopping`]. Call once, before any thread starts.
pub fn take_socket() {
    let value = std::env::var_os("NOTIFY_SOCKET");
    if value.is_some() {
        std::env::remove_var("NOTIFY_SOCKET");
    }
    let _ = SOCKET.set(value);
}

/// Tells systemd (if it started us with `Type=notify`) that veris accepts
/// connections.
pub fn ready() {
    send("READY=1\n");
}

/// Tells systemd that veris is shutting down.
pub fn stopping() {
    send("STOPPING=1\n");
}

/// One datagram; a failure is logged, never fatal: without the message
/// systemd times the start out, which says more than an exit would.
fn send(state: &str) {
    let Some(Some(socket)) = SOCKET.get() else {
        return;
    };
    if let Err(e) = send_to(socket, state) {
        tracing::warn!(
            socket = %socket.to_string_lossy(),
            "cannot notify systemd ({}): {e}. Next: check the unit's NotifyAccess= and that the socket is writable by the proxy uid",
            state.trim_end()
        );
    }
}

fn send_to(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let addr = address(socket)?;
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// A path, or an abstract name written `@name`.
fn address(socket: &std::ffi::OsStr) -> std::io::Result<SocketAddr> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = socket.as_bytes();
    match bytes.split_first() {
        Some((b'@', name)) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name)
        }
        Some((b'/', _)) => SocketAddr::from_pathname(socket),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "NOTIFY_SOCKET is neither an absolute path nor an @abstract name",
        )),
    }
}
