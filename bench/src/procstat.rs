//! What the kernel says about a child process: CPU time and memory.
//!
//! CPU time is `utime + stime` from `/proc/PID/stat`, which covers every
//! thread the process ever had (also the exited ones), in clock ticks
//! (`sysconf(_SC_CLK_TCK)`, 100 per second on Linux: 10 ms). A measured run
//! keeps a proxy busy for a second or more, so the tick is about 1% of what
//! it counts; per-thread `schedstat` would be finer but forgets threads that
//! exit. Memory is `VmRSS` (now) and `VmHWM` (the peak) from `/proc/PID/status`.

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
    }
}
