//! Per-process flags and identity: the effective uid, the dumpable flag
//! that keeps a same-uid workload out of the proxy's memory, dying with the
//! parent, every capability given up before exec, and trimming the heap
//! after a large read.
#![allow(unsafe_code)]

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

/// Hands the heap's free pages back to the kernel (glibc `malloc_trim`).
/// A receipt read parses on worker threads, each with its own malloc arena;
/// what they free stays in those arenas, so without this a `serve` that
/// answered one `/receipt` over a large ledger kept several MB above idle.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim(3) takes an integer and only walks glibc's own
    // allocator state, under its locks; it is safe from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Asks the kernel to SIGKILL this process when its parent exits.
pub fn die_with_parent() -> std::io::Result<()> {
    // SAFETY: prctl(2) with integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes `cmd`'s child give up every capability before exec, for good:
/// securebits that stop uid 0 from regaining them at exec (locked), an
/// empty bounding set, no ambient or inheritable ones, no effective or
/// permitted ones, and no_new_privs (no setuid or file capabilities
/// either). What runs then cannot change nftables rules, set a packet
/// mark, mount, or enter another namespace.
pub fn drop_capabilities_at_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs between fork and exec and makes raw
    // syscalls only (no allocation, no locks), which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            let fail = || Err(std::io::Error::last_os_error());
            // SECBIT_NOROOT | _LOCKED | SECBIT_NO_SETUID_FIXUP | _LOCKED |
            // SECBIT_KEEP_CAPS_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED.
            let bits: libc::c_ulong = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80;
            if libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) != 0 {
                return fail();
            }
            for cap in 0..64 {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
                    && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL)
                {
                    return fail();
                }
            }
            if libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            ) != 0
            {
                return fail();
            }
            #[repr(C)]
            struct Header {
                version: u32,
                pid: libc::c_int,
            }
            #[repr(C)]
            #[derive(Clone, Copy)]
            struct Data {
                effective: u32,
                permitted: u32,
                inheritable: u32,
            }
            let header = Header {
                version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
                pid: 0,
            };
            let data = [Data {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            }; 2];
            if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) != 0 {
                return fail();
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return fail();
            }
            Ok(())
        });
    }
}
