//! What the kernel says about a child process: CPU time and memory.
//!
//! CPU time is `utime + stime` from `/proc/PID/stat`, which covers every
//! thread the process ever had (also the exited ones), in clock ticks
//! (`sysconf(_SC_CLK_TCK)`, 100 per second on Linux: 10 ms). A measured run
//! keeps a proxy busy for a second or more, so the tick is about 1% of what
//! it counts; per-thread `schedstat` would be finer but forgets threads that
//! exit. Memory is `VmRSS` (now) and `VmHWM` (the peak) from `/proc/PID/status`.
//! [`activity`] adds counts that do not depend on how busy the machine is as
//! much as time does: system time apart, context switches of the live
//! threads, and read/write syscalls (`/proc/PID/io`, every thread ever).

use std::time::Duration;

/// A process's CPU time (user + system) so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: count fields
    // after the last `)`. utime and stime are fields 14 and 15 of the line,
    // the 12th and 13th after the name.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = rustix::param::clock_ticks_per_second().max(1);
    Some(Duration::from_nanos(
        (utime + stime) * 1_000_000_000 / ticks,
    ))
}

/// Counters of a process at one moment; [`Activity::since`] gives a window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Activity {
    /// System (kernel) CPU time.
    pub system: Duration,
    /// Voluntary + involuntary context switches of the threads alive now.
    pub switches: u64,
    /// `syscr + syscw`: read- and write-family syscalls.
    pub io_calls: u64,
}

impl Activity {
    /// What happened between `before` and `self` (saturating: a thread
    /// that exited takes its switches with it).
    pub fn since(&self, before: &Activity) -> Activity {
        Activity {
            system: self.system.saturating_sub(before.system),
            switches: self.switches.saturating_sub(before.switches),
            io_calls: self.io_calls.saturating_sub(before.io_calls),
        }
    }
}

/// The process's [`Activity`] counters now (zero where unreadable).
pub fn activity(pid: u32) -> Activity {
    let system = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let rest = &stat[stat.rfind(')')? + 1..];
            let stime: u64 = rest.split_whitespace().nth(12)?.parse().ok()?;
            let ticks = rustix::param::clock_ticks_per_second().max(1);
            Some(Duration::from_nanos(stime * 1_000_000_000 / ticks))
        })
        .unwrap_or_default();
    let field = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let mut switches = 0;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(st) = std::fs::read_to_string(t.path().join("status")) {
                switches += field(&st, "voluntary_ctxt_switches:")
                    + field(&st, "nonvoluntary_ctxt_switches:");
            }
        }
    }
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    Activity {
        system,
        switches,
        io_calls: field(&io, "syscr:") + field(&io, "syscw:"),
    }
}

/// `VmRSS` in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmRSS:")
}

/// `VmHWM` (peak resident set) in KiB.
pub fn peak_rss_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// `Threads`: how many the process has now.
pub fn threads(pid: u32) -> Option<u64> {
    status_kib(pid, "Threads:")
}

/// The first number of a `/proc/PID/status` line (KiB for the `Vm` ones).
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(cpu_time(pid).is_some());
        assert!(rss_kib(pid).unwrap_or(0) > 0);
        assert!(threads(pid).unwrap_or(0) >= 1);
        // RSS first: the peak read after it can only be as high or higher
        // (other tests' threads allocate in between).
        let rss = rss_kib(pid).unwrap_or(0);
        assert!(peak_rss_kib(pid).unwrap_or(0) >= rss);
        let before = activity(pid);
        std::fs::read_to_string("/proc/self/stat").unwrap();
        let after = activity(pid);
        assert!(after.switches >= 1 && after.io_calls > before.io_calls);
        assert_eq!(after.since(&after).io_calls, 0);
    }
}
