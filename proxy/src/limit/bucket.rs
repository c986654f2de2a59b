//! A token bucket: `rate` tokens a second, holding at most `burst`. Requests
//! take a whole token or are refused with the wait until one is there
//! ([`TokenBucket::take`]); bytes are paid after they moved
//! ([`TokenBucket::debit`], which may leave the bucket in debt) and the next
//! move waits until the debt is paid ([`TokenBucket::debt`]), so a shared
//! bucket meters many connections without knowing in advance how many
//! bytes a read will return.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

// Tokio's clock: the same as std's, but one a test can pause.
use tokio::time::Instant;

/// Tokens refilled continuously at `rate` a second, up to `burst`.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Below zero: a debt to pay before the next move.
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled at `rate` a second (both at
    /// least 1).
    pub fn new(rate: u64, burst: u64) -> TokenBucket {
        TokenBucket::starting(rate, burst, Instant::now())
    }

    fn starting(rate: u64, burst: u64, at: Instant) -> TokenBucket {
        let burst = burst.max(1) as f64;
        TokenBucket {
            rate: rate.max(1) as f64,
            burst,
            state: Mutex::new(State { tokens: burst, at }),
        }
    }

    /// The most tokens the bucket holds.
    pub fn burst(&self) -> u64 {
        self.burst as u64
    }

    /// Takes one token, or says how long until one is there (taking none).
    pub fn take(&self) -> Result<(), Duration> {
        self.take_at(Instant::now())
    }

    /// Pays for `n` units that moved: the bucket may go into debt.
    pub fn debit(&self, n: u64) {
        self.debit_at(n, Instant::now());
    }

    /// How long until the bucket's debt is paid, or `None` when it has none.
    pub fn debt(&self) -> Option<Duration> {
        self.debt_at(Instant::now())
    }

    fn take_at(&self, now: Instant) -> Result<(), Duration> {
        let mut state = self.refilled(now);
        if state.tokens >= 1.0 {
            state.tokens -= 1.0;
            return Ok(());
        }
        Err(self.until(1.0 - state.tokens))
    }

    fn debit_at(&self, n: u64, now: Instant) {
        self.refilled(now).tokens -= n as f64;
    }

    fn debt_at(&self, now: Instant) -> Option<Duration> {
        let state = self.refilled(now);
        (state.tokens < 0.0).then(|| self.until(-state.tokens))
    }

    /// The time `missing` tokens take to refill, at least a millisecond so
    /// a waiter never spins.
    fn until(&self, missing: f64) -> Duration {
        Duration::from_secs_f64(missing / self.rate).max(Duration::from_millis(1))
    }

    fn refilled(&self, now: Instant) -> std::sync::MutexGuard<'_, State> {
        // A panic cannot leave the two numbers half-written: take the guard.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed = now.saturating_duration_since(state.at).as_secs_f64();
        state.tokens = (state.tokens + elapsed * self.rate).min(self.burst);
        state.at = state.at.max(now);
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_burst_is_served_then_requests_wait_for_the_rate() {
        let t0 = Instant::now();
        let bucket = TokenBucket::starting(10, 3, t0);
        for _ in 0..3 {
            assert_eq!(bucket.take_at(t0), Ok(()));
        }
        let wait = bucket.take_at(t0).expect_err("the burst is spent");
        assert_eq!(wait, Duration::from_millis(100), "one token at 10/s");
        // A refusal takes nothing: the token is there 100 ms on.
        assert!(bucket.take_at(t0 + 99 * MS).is_err());
        assert_eq!(bucket.take_at(t0 + 100 * MS), Ok(()));
        assert!(bucket.take_at(t0 + 100 * MS).is_err());
    }

    #[test]
    fn an_idle_bucket_refills_only_to_its_burst() {
        let t0 = Instant::now();
        let bucket = TokenBucket::starting(1000, 5, t0);
        for _ in 0..5 {
            bucket.take_at(t0).unwrap();
        }
        let later = t0 + Duration::from_secs(60);
        for _ in 0..5 {
            assert_eq!(bucket.take_at(later), Ok(()));
        }
        assert!(
            bucket.take_at(later).is_err(),
            "60 s idle is still 5 tokens"
        );
    }

    #[test]
    fn bytes_paid_after_they_moved_leave_a_debt_paid_at_the_rate() {
        let t0 = Instant::now();
        let bucket = TokenBucket::starting(1000, 1000, t0);
        assert_eq!(bucket.debt_at(t0), None);
        bucket.debit_at(1500, t0);
        assert_eq!(bucket.debt_at(t0), Some(Duration::from_millis(500)));
        assert_eq!(
            bucket.debt_at(t0 + 250 * MS),
            Some(Duration::from_millis(250))
        );
        assert_eq!(bucket.debt_at(t0 + 500 * MS), None);
        // Over a long run the rate holds: 10 s at 1000/s is 10,000 units
        // beyond the first burst, however they are split.
        let mut now = t0 + 500 * MS;
        let mut moved = 0u64;
        while now < t0 + Duration::from_millis(10_500) {
            match bucket.debt_at(now) {
                Some(wait) => now += wait,
                None => {
                    bucket.debit_at(300, now);
                    moved += 300;
                }
            }
        }
        assert!((10_000..=10_300 + 1000).contains(&moved), "{moved}");
    }

    #[test]
    fn a_wait_is_never_zero() {
        let t0 = Instant::now();
        let bucket = TokenBucket::starting(u64::MAX, 1, t0);
        bucket.take_at(t0).unwrap();
        assert!(bucket.take_at(t0).unwrap_err() >= MS);
        bucket.debit_at(1, t0);
        assert!(bucket.debt_at(t0).unwrap() >= MS);
    }

    #[test]
    fn a_clock_that_steps_back_refills_nothing() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let bucket = TokenBucket::starting(10, 1, t0);
        bucket.take_at(t0).unwrap();
        assert!(bucket.take_at(t0 - Duration::from_secs(5)).is_err());
        assert!(bucket.take_at(t0 + 99 * MS).is_err());
    }
}
