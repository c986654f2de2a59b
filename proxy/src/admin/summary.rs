//! The traffic summary at `info`. The per-request line is at `debug`: at
//! `info` it was one formatted, coloured stderr write per request, a
//! measurable share of the proxy's CPU. An operator still sees what flows:
//! while requests come in, one line at most every [`EVERY`] with the counts
//! since the previous line, and the rest when the proxy stops.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::info;

/// At most one summary line this often.
pub const EVERY: Duration = Duration::from_secs(10);

/// Counts since the last summary line. `Sync`; bumped by every exchange.
#[derive(Debug)]
pub struct Summary {
    /// Answers from the twin by status class: 1xx..5xx at index 0..4.
    classes: [AtomicU64; 5],
    /// Requests the twin did not answer (unreachable, timeout).
    upstream_errors: AtomicU64,
    /// Requests whose client left before the answer.
    client_gone: AtomicU64,
    /// When the last line was logged; `try_lock` picks one logger.
    last: Mutex<Instant>,
}

impl Default for Summary {
    fn default() -> Self {
        Summary {
            classes: Default::default(),
            upstream_errors: AtomicU64::new(0),
            client_gone: AtomicU64::new(0),
            last: Mutex::new(Instant::now()),
        }
    }
}

/// How one forwarded request ended, for the counts.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    Answered(u16),
    ClientGone,
    UpstreamError,
}

impl Summary {
    pub fn note(&self, outcome: Outcome) {
        match outcome {
            Outcome::Answered(status) => {
                let class = usize::from(status / 100).clamp(1, 5) - 1;
                self.classes[class].fetch_add(1, Relaxed);
            }
            Outcome::ClientGone => {
                self.client_gone.fetch_add(1, Relaxed);
            }
            Outcome::UpstreamError => {
                self.upstream_errors.fetch_add(1, Relaxed);
            }
        }
        // Whoever finds the interval over logs; the others go on.
        if let Ok(mut last) = self.last.try_lock() {
            if last.elapsed() >= EVERY {
                let since = last.elapsed();
                *last = Instant::now();
                drop(last);
                self.log(since);
            }
        }
    }

    /// Logs what was counted since the last line, if anything (at shutdown).
    pub fn flush(&self) {
        let since = match self.last.lock() {
            Ok(mut last) => {
                let since = last.elapsed();
                *last = Instant::now();
                since
            }
            Err(poisoned) => poisoned.into_inner().elapsed(),
        };
        self.log(since);
    }

    fn log(&self, since: Duration) {
        let [c1, c2, c3, c4, c5] = self.classes.each_ref().map(|c| c.swap(0, Relaxed));
        let upstream_errors = self.upstream_errors.swap(0, Relaxed);
        let client_gone = self.client_gone.swap(0, Relaxed);
        let requests = c1 + c2 + c3 + c4 + c5 + upstream_errors + client_gone;
        if requests == 0 {
            return;
        }
        info!(
            requests,
            seconds = since.as_secs(),
            ok_2xx = c2,
            redirect_3xx = c3,
            client_error_4xx = c4,
            server_error_5xx = c5,
            informational_1xx = c1,
            upstream_errors,
            client_gone,
            "forwarded to the twin (per-request lines at VERIS_LOG=debug)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_once() {
        let s = Summary::default();
        s.note(Outcome::Answered(200));
        s.note(Outcome::Answered(404));
        s.note(Outcome::Answered(99));
        s.note(Outcome::ClientGone);
        s.note(Outcome::UpstreamError);
        assert_eq!(s.classes[0].load(Relaxed), 1);
        assert_eq!(s.classes[1].load(Relaxed), 1);
        assert_eq!(s.classes[3].load(Relaxed), 1);
        s.flush();
        assert!(s.classes.iter().all(|c| c.load(Relaxed) == 0));
        assert_eq!(s.client_gone.load(Relaxed), 0);
        assert_eq!(s.upstream_errors.load(Relaxed), 0);
    }
}
