//! Namespaces and mounts, for the isolated run's init steps.
#![allow(unsafe_code)]

/// Moves this (single-threaded) process into new namespaces (`CLONE_NEW*`
/// flags); the isolated run's init step (`crate::tier::isolated`).
pub fn unshare(flags: i32) -> std::io::Result<()> {
    // SAFETY: unshare(2) takes flags only. Callers are single-threaded (the
    // hidden `__isolate` steps run before any runtime or thread exists), so
    // no other thread can observe a changed namespace or file table.
    let rc = unsafe { libc::unshare(flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// mount(2) with C strings made here; `None` passes NULL.
pub fn mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
) -> std::io::Result<()> {
    use std::ffi::CString;
    let c = |s: &str| CString::new(s).map_err(|_| std::io::Error::other("NUL in a mount path"));
    let source = source.map(c).transpose()?;
    let target = c(target)?;
    let fstype = fstype.map(c).transpose()?;
    let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is a NUL-terminated string that outlives the
    // call, or NULL where mount(2) allows it; no data argument is passed.
    let rc = unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            std::ptr::null(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
