//! Uid switching for the transparent tier's privilege drop:
//! setgroups/setgid/setuid, each call a plain syscall with integer
//! arguments.

// Unsafe: glibc's process-wide setgroups/setgid/setuid (see `drop_to`).
#![allow(unsafe_code)]

/// Drops every group, then gid, then uid (in that order: after setuid we
/// could no longer change groups), and verifies root cannot be regained.
/// glibc applies each call to every thread of the process; rustix's
/// `set_thread_*` are the raw syscalls, which change the calling thread
/// only, so these three stay libc's (as does the setuid(0) that must fail).
pub fn drop_to(uid: u32, gid: u32) -> std::io::Result<()> {
    let groups = [gid];
    // SAFETY: the pointer and length describe `groups`, alive for the call.
    if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: integer-only syscalls.
    if unsafe { libc::setgid(gid) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::setuid(uid) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a setuid(0) that must fail; integer-only.
    let regained = unsafe { libc::setuid(0) } == 0;
    use rustix::process::{getegid, geteuid, getgid, getuid};
    let (ruid, euid) = (getuid().as_raw(), geteuid().as_raw());
    let (rgid, egid) = (getgid().as_raw(), getegid().as_raw());
    if ruid != uid || euid != uid || rgid != gid || egid != gid || regained {
        return Err(std::io::Error::other(format!(
            "privilege drop did not stick (uid {ruid}/{euid}, gid {rgid}/{egid}, root regained: {regained})"
        )));
    }
    Ok(())
}
