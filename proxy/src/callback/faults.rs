//! `--webhook-faults`: deliveries made wrong on purpose, so a user can see
//! that the app is idempotent, copes with events out of order or late, and
//! rejects signatures it must not accept. Each delivery a fault touched
//! says so in its `callback` line ([`Faults::label`]), and such a delivery
//! never counts toward a callback requirement by default.

use std::time::Duration;

/// Stripe's SDKs accept a signature whose `t` is this close to their clock.
pub const TOLERANCE: Duration = Duration::from_secs(300);

/// How far back a `stale-signature` delivery dates its `t`: twice the
/// tolerance, so no SDK's clock skew allowance makes it pass.
pub const STALE_BY: Duration = Duration::from_secs(2 * 300);

/// The longest `delay=` taken (before the time scale).
pub const MAX_DELAY: Duration = Duration::from_secs(600);

/// How long `reorder` holds events before sending the held ones newest
/// first (not scaled: it is about the order, not the wait). The end of the
/// session sends what is held at once.
pub const REORDER_HOLD: Duration = Duration::from_secs(3);

/// Events `reorder` holds at most; a full hold is sent at once.
pub const REORDER_BATCH: usize = 64;

/// The faults put on every delivery.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Faults {
    /// Each event is delivered twice; the second is marked `duplicate`.
    pub duplicate: bool,
    /// Events are held up to [`REORDER_HOLD`] and sent newest first.
    pub reorder: bool,
    /// Each first attempt waits this long (times the time scale).
    pub delay: Option<Duration>,
    /// The signature's `t` is [`STALE_BY`] in the past.
    pub stale_signature: bool,
    /// The `v1` is made with a key that is not the app's secret.
    pub bad_signature: bool,
}

impl Faults {
    pub fn is_empty(&self) -> bool {
        *self == Faults::default()
    }

    /// What a delivery's line says of its faults (`None`: none); `copy` for
    /// the second delivery of `duplicate`.
    pub fn label(&self, copy: bool) -> Option<String> {
        let mut parts = Vec::new();
        if copy {
            parts.push("duplicate".to_string());
        }
        if self.reorder {
            parts.push("reorder".into());
        }
        if let Some(d) = self.delay {
            parts.push(format!("delay={}", shown(d)));
        }
        if self.stale_signature {
            parts.push("stale-signature".into());
        }
        if self.bad_signature {
            parts.push("bad-signature".into());
        }
        (!parts.is_empty()).then(|| parts.join(","))
    }
}

/// A delay as given: whole seconds as `Ns`, else milliseconds.
fn shown(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_name_each_fault_and_only_copies_are_duplicates() {
        assert_eq!(Faults::default().label(false), None);
        let all = Faults {
            duplicate: true,
            reorder: true,
            delay: Some(Duration::from_millis(1500)),
            stale_signature: true,
            bad_signature: true,
        };
        assert_eq!(
            all.label(false).as_deref(),
            Some("reorder,delay=1500ms,stale-signature,bad-signature")
        );
        let dup = Faults {
            duplicate: true,
            ..Faults::default()
        };
        assert_eq!(dup.label(false), None);
        assert_eq!(dup.label(true).as_deref(), Some("duplicate"));
        let delay = Faults {
            delay: Some(Duration::from_secs(30)),
            ..Faults::default()
        };
        assert_eq!(delay.label(false).as_deref(), Some("delay=30s"));
    }
}
