//! A full webhook queue is on record (W1, issue #31): a workload that makes
//! objects faster than its app takes their deliveries fills the queue, and
//! the events that found no room are counted in `callback_dropped` lines,
//! so the receipt says how many were never delivered instead of reading as
//! if every event was. The queue is made small with the test knob
//! `VERIS_WEBHOOK_QUEUE=2` (2 events under way, 2 queued); the app never
//! answers, so nothing leaves the queue while the workload runs.
//! Attack: a workload that floods objects must not make drops vanish.

use crate::support;
use crate::webhook::{callbacks, free_port, ledger, run_app, tools};

use support::{skip, text, TempDir};

#[test]
fn events_past_a_full_queue_are_counted_in_the_receipt() {
    if let Err(why) = tools() {
        return skip(&why);
    }
    let dir = TempDir::new("webhook-queue");
    let port = free_port();
    let url = format!("stripe=http://127.0.0.1:{port}/webhook");
    // 8 customers and a charge: 9 events; 2 under way (the app never
    // answers within the attempt's 60 s), 2 queued, 5 dropped.
    let out = run_app(
        &dir,
        &["--webhook", &url],
        &[format!("{port}:hang")],
        &[
            ("VERIS_WEBHOOK_QUEUE", "2"),
            ("VERIS_WEBHOOK_TIMEOUT_MS", "60000"),
            ("APP_CUSTOMER", "8"),
            ("APP_WAIT", "1"),
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(stdout.contains("charge ch_"), "{stdout}\n{stderr}");
    let lines = ledger(&dir);
    let dropped: Vec<_> = lines
        .iter()
        .filter(|l| l["kind"] == "callback_dropped")
        .collect();
    assert!(!dropped.is_empty(), "no callback_dropped line: {stderr}");
    for d in &dropped {
        assert_eq!(
            (&d["service"], &d["reason"], &d["v"]),
            (&"stripe".into(), &"queue_full".into(), &9.into()),
            "{d}"
        );
    }
    let total: u64 = dropped.iter().filter_map(|d| d["events"].as_u64()).sum();
    assert_eq!(total, 5, "{dropped:?}");
    // The four events that were taken are each attempted (and cut by the
    // end of the session); the dropped ones never are.
    let attempted: std::collections::BTreeSet<_> = callbacks(&lines)
        .iter()
        .filter_map(|c| c["event_id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(attempted.len(), 4, "{attempted:?}");
    assert!(
        stderr.contains("5 webhook event(s) dropped (queue full): never delivered"),
        "the receipt says so: {stderr}"
    );
}
