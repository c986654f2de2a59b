//! What a child inherits: a passed fd (the isolated run's control socket,
//! `--report-fd`), the open-file limit, blocking stdio.

// Unsafe: pre_exec hooks, and adopting an inherited fd as an OwnedFd.
#![allow(unsafe_code)]

/// Makes `fd` the child's file descriptor `target` (without close-on-exec).
pub fn pass_fd(
    cmd: &mut tokio::process::Command,
    fd: std::os::fd::RawFd,
    target: std::os::fd::RawFd,
) {
    // SAFETY: dup2(2) between fork and exec: a raw syscall, async-signal-safe.
    // libc's, not rustix's: rustix's dup2 wants the target as an `OwnedFd`,
    // which `target` is not (yet) in the child.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, target) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Takes ownership of an inherited file descriptor, if it is open.
pub fn inherited_fd(fd: std::os::fd::RawFd) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl(F_GETFD) only asks whether `fd` is open. libc's, not
    // rustix's: rustix takes a `BorrowedFd`, which must already be open.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: `fd` is open, was inherited for this purpose (the parent put
    // it there with `pass_fd`), and nothing else in this process owns it.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// The open-file limit (soft, hard); `None` for unlimited.
pub type FileLimit = (Option<u64>, Option<u64>);

/// Raises the soft open-file limit to the hard one (every connection holds
/// a descriptor, two when proxied; the default 1,024 is reached by a few
/// hundred idle clients). Returns the limit before and after.
pub fn raise_open_file_limit() -> (FileLimit, FileLimit) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    let raised = Rlimit {
        current: before.maximum,
        maximum: before.maximum,
    };
    let _ = setrlimit(Resource::Nofile, raised);
    let after = getrlimit(Resource::Nofile);
    (
        (before.current, before.maximum),
        (after.current, after.maximum),
    )
}

/// Gives `cmd`'s child the open-file limit this process started with: the
/// command under `veris run` sees its usual environment, not the proxy's.
pub fn restore_file_limit_at_exec(cmd: &mut tokio::process::Command, limit: FileLimit) {
    use rustix::process::{setrlimit, Resource, Rlimit};
    let rlimit = Rlimit {
        current: limit.0,
        maximum: limit.1,
    };
    // SAFETY: setrlimit(2) between fork and exec: a raw syscall on a value
    // copied into the closure, async-signal-safe.
    unsafe {
        cmd.pre_exec(move || Ok(setrlimit(Resource::Nofile, rlimit)?));
    }
}

/// Clears O_NONBLOCK on stdout and stderr, which a child sharing them may
/// have set: printing the receipt must not fail with EAGAIN.
pub fn blocking_stdio() {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    use std::os::fd::AsFd;
    for fd in [std::io::stdout().as_fd(), std::io::stderr().as_fd()] {
        if let Ok(flags) = fcntl_getfl(fd) {
            if flags.contains(OFlags::NONBLOCK) {
                let _ = fcntl_setfl(fd, flags - OFlags::NONBLOCK);
            }
        }
    }
}
