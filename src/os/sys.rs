//! The one place the binary makes raw syscalls (besides the privilege drop in
//! `transparent`): signalling a process group, the effective uid, the
//! dumpable flag that keeps a same-uid workload out of the proxy's memory,
//! trimming the heap after a large read, and what the isolated run's init steps need (namespaces, mounts, an
//! inherited control socket, giving up every capability before exec).
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

/// The process group job signals are passed on to (0: none yet).
static FORWARD_TO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn pass_on(signal: libc::c_int) {
    let pgid = FORWARD_TO.load(std::sync::atomic::Ordering::Relaxed);
    if pgid > 0 {
        // SAFETY: kill(2) is async-signal-safe and takes integers only.
        unsafe {
            libc::kill(-pgid, signal);
            // A stopped group would keep the signal pending forever.
            libc::kill(-pgid, libc::SIGCONT);
        }
    }
}

/// Job-control signals (INT, TERM, HUP, QUIT) no longer end this process:
/// they are passed on to the process group named by [`forward_signals_to`]
/// (until then, dropped). A handler rather than SIG_IGN: handlers reset at
/// exec, so the commands this process starts still get the default action.
pub fn survive_job_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: the handler only reads an atomic and calls kill(2), which
        // is async-signal-safe.
        unsafe { libc::signal(signal, pass_on as *const () as libc::sighandler_t) };
    }
}

/// From now on [`survive_job_signals`]' handler passes signals to `pgid`.
pub fn forward_signals_to(pgid: u32) {
    if let Ok(pgid) = i32::try_from(pgid) {
        FORWARD_TO.store(pgid, std::sync::atomic::Ordering::Relaxed);
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

/// Makes `fd` the child's file descriptor `target` (without close-on-exec).
pub fn pass_fd(
    cmd: &mut tokio::process::Command,
    fd: std::os::fd::RawFd,
    target: std::os::fd::RawFd,
) {
    // SAFETY: dup2(2) between fork and exec: a raw syscall, async-signal-safe.
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
    // SAFETY: fcntl(F_GETFD) only asks whether `fd` is open.
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
    let to_rlim = |v: Option<u64>| v.unwrap_or(libc::RLIM_INFINITY);
    let rlimit = libc::rlimit {
        rlim_cur: to_rlim(limit.0),
        rlim_max: to_rlim(limit.1),
    };
    // SAFETY: setrlimit(2) between fork and exec: a raw syscall on a value
    // copied into the closure, async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Clears O_NONBLOCK on stdout and stderr, which a child sharing them may
/// have set: printing the receipt must not fail with EAGAIN.
pub fn blocking_stdio() {
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: fcntl(2) on the process's own standard descriptors, with
        // integer arguments only.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        }
    }
}

/// Makes this process the subreaper of everything it starts
/// (`PR_SET_CHILD_SUBREAPER`): a descendant whose parent exits (a
/// `setsid`/double-fork daemon of `veris run`'s command) becomes this
/// process's child instead of init's, so [`end_descendants`] still finds it.
pub fn become_subreaper() -> std::io::Result<()> {
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    Ok(())
}

/// A process found under this one in `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descendant {
    pub pid: u32,
    /// Its `comm` (at most 15 bytes, set by the process itself).
    pub name: String,
    /// Its state letter (`S`, `D`, `T`, …) when last read.
    pub state: char,
}

/// What [`end_descendants`] did.
#[derive(Debug, Default)]
pub struct Ending {
    /// How many distinct processes were found still running and signalled.
    pub ended: usize,
    /// The ones still there at the deadline.
    pub left: Vec<Descendant>,
}

/// Ends every living descendant of this process (DESIGN §7a.14): SIGTERM
/// (with SIGCONT, so a stopped one sees it), up to `grace` for them to go,
/// then SIGKILL, repeated for whatever appears meanwhile (forks, orphans
/// reparented here), until none is left or `deadline` has passed since the
/// start. Reaps the ones that became this process's children. Found by
/// walking `/proc` for processes whose parent chain leads here; call it
/// only once the children this process waits for itself (tokio's) are
/// reaped, as the zombies among its own children are collected here.
pub fn end_descendants(grace: std::time::Duration, deadline: std::time::Duration) -> Ending {
    use rustix::process::{kill_process, Pid, Signal};
    use std::time::Instant;
    let me = std::process::id();
    let started = Instant::now();
    let mut seen = std::collections::BTreeSet::new();
    let signal = |procs: &[Descendant], sig: Signal| {
        for p in procs {
            if let Some(pid) = Pid::from_raw(p.pid as i32) {
                let _ = kill_process(pid, sig);
                if sig != Signal::KILL {
                    let _ = kill_process(pid, Signal::CONT);
                }
            }
        }
    };
    let mut living = reap_and_list(me);
    seen.extend(living.iter().map(|p| p.pid));
    signal(&living, Signal::TERM);
    let mut killing = false;
    while !living.is_empty() && started.elapsed() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        living = reap_and_list(me);
        seen.extend(living.iter().map(|p| p.pid));
        if killing || started.elapsed() >= grace {
            killing = true;
            signal(&living, Signal::KILL);
        }
    }
    Ending {
        ended: seen.len(),
        left: living,
    }
}

/// Reaps the zombies among this process's children but `except` (a child
/// someone else waits for): orphans of `veris run`'s command that ended
/// while it runs would otherwise stay zombies until it exits.
pub fn reap_orphans(except: Option<u32>) {
    reap(std::process::id(), &processes(), except);
}

fn reap(
    root: u32,
    all: &std::collections::BTreeMap<u32, (u32, char, String)>,
    except: Option<u32>,
) {
    use rustix::process::{waitpid, Pid, WaitOptions};
    for (pid, (ppid, state, _)) in all {
        if *ppid == root && *state == 'Z' && Some(*pid) != except {
            if let Some(pid) = Pid::from_raw(*pid as i32) {
                let _ = waitpid(Some(pid), WaitOptions::NOHANG);
            }
        }
    }
}

/// Reaps the zombies among `root`'s own children (only they can be), then
/// lists its living descendants.
fn reap_and_list(root: u32) -> Vec<Descendant> {
    let all = processes();
    reap(root, &all, None);
    let under = |mut pid: u32| {
        // Bounded: a parent chain is at most as long as the process table.
        for _ in 0..all.len() {
            match all.get(&pid) {
                Some((ppid, ..)) if *ppid == root => return true,
                Some((ppid, ..)) if *ppid > 1 => pid = *ppid,
                _ => return false,
            }
        }
        false
    };
    all.iter()
        .filter(|(pid, (_, state, _))| **pid != root && *state != 'Z' && under(**pid))
        .map(|(pid, (_, state, name))| Descendant {
            pid: *pid,
            name: name.clone(),
            state: *state,
        })
        .collect()
}

/// Every process in `/proc`: pid → (parent pid, state, name).
fn processes() -> std::collections::BTreeMap<u32, (u32, char, String)> {
    let mut all = std::collections::BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return all;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let mut rest = stat[close + 1..].split_whitespace();
        let state = rest.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let Some(ppid) = rest.next().and_then(|p| p.parse().ok()) else {
            continue;
        };
        all.insert(pid, (ppid, state, name));
    }
    all
}

/// Where a system tool the isolated and transparent tiers run (`nft`,
/// `ip`) lives: the first executable on `PATH`, else in the sbin dirs
/// distributions put them in, which a normal user's `PATH` lacks (Debian's
/// `nft` is `/usr/sbin/nft`): `VERIS_SBIN_DIRS` (a `PATH`-style list; empty
/// for none), by default `/usr/local/sbin:/usr/sbin:/sbin`. `None` when
/// there is none.
pub fn find_tool(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let sbin = std::env::var_os("VERIS_SBIN_DIRS")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/sbin:/sbin".into());
    std::env::split_paths(&path)
        .chain(std::env::split_paths(&sbin).filter(|d| !d.as_os_str().is_empty()))
        .map(|dir| dir.join(program))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// [`find_tool`], or the bare name (so the error names what is missing).
pub fn tool(program: &str) -> std::path::PathBuf {
    find_tool(program).unwrap_or_else(|| program.into())
}
