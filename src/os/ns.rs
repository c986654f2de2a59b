//! Namespaces and mounts, for the isolated run's init steps.

// Unsafe: rustix's unshare_unsafe, never with CLONE_FILES (see `unshare`).
#![allow(unsafe_code)]

pub use rustix::mount::MountFlags;
pub use rustix::thread::UnshareFlags;

/// Moves this (single-threaded) process into new namespaces (`CLONE_NEW*`
/// flags); the isolated run's init step (`crate::tier::isolated`).
pub fn unshare(flags: UnshareFlags) -> std::io::Result<()> {
    debug_assert!(!flags.contains(UnshareFlags::FILES));
    // SAFETY: unsafe only for `UnshareFlags::FILES` (another thread could
    // then be left with fds of a table it no longer has), which the callers
    // never pass; and they are single-threaded (the hidden `__isolate` steps
    // run before any runtime or thread exists).
    unsafe {
        rustix::thread::unshare_unsafe(flags)?;
    }
    Ok(())
}

/// Makes every mount under `/` private, recursively: mounts made here stay here.
pub fn make_private() -> std::io::Result<()> {
    use rustix::mount::MountPropagationFlags as P;
    rustix::mount::mount_change("/", P::PRIVATE | P::REC)?;
    Ok(())
}

/// Mounts a fresh `fstype` file system (`tmpfs`, `proc`) at `target`.
pub fn mount_fs(
    fstype: &str,
    target: impl rustix::path::Arg,
    flags: MountFlags,
) -> std::io::Result<()> {
    rustix::mount::mount(fstype, target, fstype, flags, None)?;
    Ok(())
}

/// Bind-mounts `source` at `target` (with what is mounted under it when `recursive`).
pub fn bind(
    source: impl rustix::path::Arg,
    target: impl rustix::path::Arg,
    recursive: bool,
) -> std::io::Result<()> {
    if recursive {
        rustix::mount::mount_bind_recursive(source, target)?;
    } else {
        rustix::mount::mount_bind(source, target)?;
    }
    Ok(())
}

/// Remounts the bind mount at `target` read-only.
pub fn remount_read_only(target: impl rustix::path::Arg) -> std::io::Result<()> {
    rustix::mount::mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, c"")?;
    Ok(())
}
