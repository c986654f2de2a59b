//! Per-process flags and identity: the effective uid, the dumpable flag
//! that keeps a same-uid workload out of the proxy's memory, dying with the
//! parent, every capability given up before exec, and trimming the heap
//! after a large read.

// Unsafe: a pre_exec hook that drops capabilities, and glibc's malloc_trim.
#![allow(unsafe_code)]

/// The effective uid of this process.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE 0`): a process of the
/// same uid (the workload under `veris run`) can then neither ptrace it nor
/// read `/proc/<pid>/mem`, where the run's seal key and admin token live.
pub fn set_non_dumpable() -> std::io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)?;
    Ok(())
}

/// Hands the heap's free pages back to the kernel (glibc `malloc_trim`).
/// A receipt read parses on worker threads, each with its own malloc arena;
/// what they free stays in those arenas, so without this a `serve` that
/// answered one `/receipt` over a large ledger kept several MB above idle.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim(3) takes an integer and only walks glibc's own
    // allocator state, under its locks; it is safe from any thread. A libc
    // function, not a system call: rustix has no counterpart.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Asks the kernel to SIGKILL this process when its parent exits.
pub fn die_with_parent() -> std::io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    Ok(())
}

/// Makes `cmd`'s child give up every capability before exec, for good:
/// securebits that stop uid 0 from regaining them at exec (locked), an
/// empty bounding set, no ambient or inheritable ones, no effective or
/// permitted ones, and no_new_privs (no setuid or file capabilities
/// either). What runs then cannot change nftables rules, set a packet
/// mark, mount, or enter another namespace.
pub fn drop_capabilities_at_exec(cmd: &mut std::process::Command) {
    use rustix::io::Errno;
    use rustix::thread::{CapabilitiesSecureBits as Bits, CapabilitySet, CapabilitySets};
    use std::os::unix::process::CommandExt;
    let drop_all = || -> rustix::io::Result<()> {
        rustix::thread::set_capabilities_secure_bits(
            Bits::NO_ROOT
                | Bits::NO_ROOT_LOCKED
                | Bits::NO_SETUID_FIXUP
                | Bits::NO_SETUID_FIXUP_LOCKED
                | Bits::KEEP_CAPS_LOCKED
                | Bits::NO_CAP_AMBIENT_RAISE
                | Bits::NO_CAP_AMBIENT_RAISE_LOCKED,
        )?;
        // Every bit, not only the capabilities rustix names: EINVAL marks
        // the end of what this kernel knows.
        for cap in 0..64 {
            match rustix::thread::remove_capability_from_bounding_set(
                CapabilitySet::from_bits_retain(1 << cap),
            ) {
                Ok(()) | Err(Errno::INVAL) => {}
                Err(e) => return Err(e),
            }
        }
        rustix::thread::clear_ambient_capability_set()?;
        rustix::thread::set_capabilities(
            None,
            CapabilitySets {
                effective: CapabilitySet::empty(),
                permitted: CapabilitySet::empty(),
                inheritable: CapabilitySet::empty(),
            },
        )?;
        rustix::thread::set_no_new_privs(true)
    };
    // SAFETY: the closure runs between fork and exec and makes raw
    // syscalls only (no allocation, no locks), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || drop_all().map_err(std::io::Error::from));
    }
}
