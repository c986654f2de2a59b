//! The one place the binary makes raw syscalls: signalling a process group.
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
