//! The one place the binary makes raw syscalls (besides the privilege drop in
//! `transparent`): signalling a process group, the effective uid, and the
//! dumpable flag that keeps a same-uid workload out of the proxy's memory.
#![allow(unsafe_code)]

/// Sends `signal` to every process in group `pgid`.
pub fn kill_group(pgid: u32, signal: i32) -> std::io::Result<()> {
    let pgid = i32::try_from(pgid).map_err(|_| std::io::Error::other("pid out of range"))?;
    // SAFETY: kill(2) takes plain integers and has no memory effects; a negative
    // pid addresses the process group, which we created for the child.
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The effective uid of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE 0`): a process of the
/// same uid (the workload under `veris run`) can then neither ptrace it nor
/// read `/proc/<pid>/mem`, where the run's seal key and admin token live.
pub fn set_non_dumpable() -> std::io::Result<()> {
    // SAFETY: prctl(2) with integer arguments only; PR_SET_DUMPABLE reads none
    // of the trailing arguments.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
