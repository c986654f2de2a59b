//! Processes: signalling a process group, surviving and forwarding job
//! signals, the subreaper, and ending every descendant found in `/proc`.

// Unsafe: installing the job-signal handler; rustix has no safe way.
#![allow(unsafe_code)]

use rustix::process::{kill_process_group, Pid, Signal};

/// Sends `signal` to every process in group `pgid`.
pub fn kill_group(pgid: u32, signal: Signal) -> std::io::Result<()> {
    let pgid = i32::try_from(pgid)
        .ok()
        .and_then(Pid::from_raw)
        .ok_or_else(|| std::io::Error::other("pid out of range"))?;
    kill_process_group(pgid, signal)?;
    Ok(())
}

/// The process group job signals are passed on to (0: none yet).
static FORWARD_TO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn pass_on(signal: libc::c_int) {
    let pgid = Pid::from_raw(FORWARD_TO.load(std::sync::atomic::Ordering::Relaxed));
    // kill(2) is async-signal-safe; so are these integer conversions.
    if let (Some(pgid), Some(signal)) = (pgid, Signal::from_named_raw(signal)) {
        let _ = kill_process_group(pgid, signal);
        // A stopped group would keep the signal pending forever.
        let _ = kill_process_group(pgid, Signal::CONT);
    }
}

/// Job-control signals (INT, TERM, HUP, QUIT) no longer end this process:
/// they are passed on to the process group named by [`forward_signals_to`]
/// (until then, dropped). A handler rather than SIG_IGN: handlers reset at
/// exec, so the commands this process starts still get the default action.
pub fn survive_job_signals() {
    for signal in [Signal::INT, Signal::TERM, Signal::HUP, Signal::QUIT] {
        // SAFETY: the handler only reads an atomic and calls kill(2), which
        // is async-signal-safe. rustix offers no safe way to install a
        // handler (its `runtime` sigaction is for libc-less programs).
        unsafe { libc::signal(signal.as_raw(), pass_on as *const () as libc::sighandler_t) };
    }
}

/// From now on [`survive_job_signals`]' handler passes signals to `pgid`.
pub fn forward_signals_to(pgid: u32) {
    if let Ok(pgid) = i32::try_from(pgid) {
        FORWARD_TO.store(pgid, std::sync::atomic::Ordering::Relaxed);
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
    use rustix::process::kill_process;
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
    use rustix::process::{waitpid, WaitOptions};
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
