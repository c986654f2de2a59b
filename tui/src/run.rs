//! The event loop: sources, keys and a frame clock feed one channel of
//! [`Event`]s into [`App::update`]; the screen is drawn on the frame clock
//! only (at most [`FPS`] times a second), so a flood of ledger lines costs
//! state updates, not redraws. Everything queued when the loop wakes is
//! applied before the next draw.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyModifiers};
use ratatui::backend::Backend;
use ratatui::Terminal;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::app::{Action, App, Event};
use crate::fleet::{FleetAction, FleetApp, FleetEvent};
use crate::fleet_render::render_fleet;
use crate::render::render;
use crate::source::{self, ReceiptFuture, ReceiptHook, SourceSpec};

/// Frames per second at most.
pub const FPS: u64 = 30;

/// Events applied per wake-up before the loop lets the frame clock in.
const MAX_DRAIN: usize = 512;

/// Events queued between the sources and the loop; a full queue makes the
/// sources wait (the ledger and the event stream hold what is not read yet).
const QUEUE: usize = 256;

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub spec: SourceSpec,
    /// Rows kept; older ones are counted.
    pub capacity: usize,
    /// How often the receipt is refreshed while new lines arrive.
    pub receipt_every: Duration,
    /// Builds the header's receipt instead of the source.
    pub receipt: Option<ReceiptHook>,
}

#[derive(Debug, thiserror::Error)]
pub enum TuiError {
    #[error("drawing to the terminal")]
    Draw(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("starting the input thread")]
    Input(#[source] std::io::Error),
    /// A source task ended while the TUI ran (it only ends by panicking).
    #[error("the {0} task stopped unexpectedly")]
    Source(&'static str),
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Runs the TUI on `terminal` until `q` (or the input ends). The caller owns
/// the terminal's raw mode and alternate screen.
pub async fn run<B>(terminal: &mut Terminal<B>, options: RunOptions) -> Result<(), TuiError>
where
    B: Backend,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let (tx, mut rx) = mpsc::channel::<Event>(QUEUE);
    let (receipt_tx, receipt_rx) = mpsc::channel::<()>(1);
    let mut feed = tokio::spawn(source::feed(options.spec.clone(), tx.clone()));
    let mut receipts = tokio::spawn(source::receipts(
        options.spec.clone(),
        options.receipt.clone(),
        receipt_rx,
        tx.clone(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let input = spawn_input(tx, stop.clone()).map_err(TuiError::Input)?;

    let size = terminal.size().map_err(|e| TuiError::Draw(Box::new(e)))?;
    let mut app = App::new(
        options.spec.describe(),
        options.capacity,
        now_ms(),
        (size.width, size.height),
    );
    app.local_clock = options.spec.same_host();
    let _ = receipt_tx.try_send(());
    let mut receipt_at = Instant::now();
    let mut receipt_seq = 0;
    let mut frame = tokio::time::interval(Duration::from_millis(1000 / FPS));
    frame.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut dirty = true;
    let mut drawn_second = 0;

    let result = 'outer: loop {
        tokio::select! {
            // The sources run until the loop drops its receivers; ending
            // earlier means a panic (the hook has already restored the
            // terminal), so the TUI stops instead of drawing on a cooked one.
            _ = &mut feed => break Err(TuiError::Source("ledger feed")),
            _ = &mut receipts => break Err(TuiError::Source("receipt")),
            ev = rx.recv() => {
                let Some(ev) = ev else { break Ok(()) };
                let mut next = Some(ev);
                let mut n = 0;
                while let Some(ev) = next.take() {
                    match app.update(ev) {
                        Some(Action::Quit) => break 'outer Ok(()),
                        Some(Action::RefreshReceipt) => {
                            let _ = receipt_tx.try_send(());
                            receipt_at = Instant::now();
                            receipt_seq = app.activity_seq();
                        }
                        None => {}
                    }
                    n += 1;
                    if n < MAX_DRAIN {
                        next = rx.try_recv().ok();
                    }
                }
                dirty = true;
            }
            _ = frame.tick() => {
                let now = now_ms();
                app.update(Event::Tick { now_ms: now });
                // New traffic refreshes the receipt at most every
                // `receipt_every`; the first traffic refreshes it at once.
                let due = receipt_seq == 0 || receipt_at.elapsed() >= options.receipt_every;
                if app.activity_seq() != receipt_seq && due {
                    let _ = receipt_tx.try_send(());
                    receipt_at = Instant::now();
                    receipt_seq = app.activity_seq();
                }
                // Uptime and sparklines move with the clock: redraw each second.
                if dirty || now / 1000 != drawn_second {
                    if let Err(e) = terminal.draw(|f| render(&app, f)) {
                        break Err(TuiError::Draw(Box::new(e)));
                    }
                    dirty = false;
                    drawn_second = now / 1000;
                }
            }
        }
    };
    stop.store(true, Ordering::Relaxed);
    feed.abort();
    receipts.abort();
    drop(rx);
    if input.join().is_err() {
        warn!("the input thread panicked");
    }
    info!(
        rows = app.rows_len(),
        last_seq = app.last_seq(),
        dropped = app.dropped,
        "tui stopped"
    );
    result
}

/// A sandbox's receipt, built by the binary (`veris receipt --nats`'s).
pub type SandboxReceipt = Arc<dyn Fn(String) -> ReceiptFuture + Send + Sync>;

pub struct FleetOptions {
    /// Words for the source, shown in the header.
    pub via: String,
    /// Lines kept per sandbox and gateway.
    pub rows: usize,
    /// Sandboxes tracked at most.
    pub sandboxes: usize,
    /// The header's integrity line.
    pub integrity: String,
    /// Builds the drilled-in sandbox's receipt.
    pub receipt: SandboxReceipt,
    /// How often that receipt is refreshed while its lines arrive.
    pub receipt_every: Duration,
}

/// Runs the fleet view on `terminal` until `q`. `feed` is the task that
/// sends the stream's messages (it gets the sender); the caller owns the
/// terminal as for [`run`].
pub async fn run_fleet<B, F>(
    terminal: &mut Terminal<B>,
    options: FleetOptions,
    feed: impl FnOnce(mpsc::Sender<FleetEvent>) -> F,
) -> Result<(), TuiError>
where
    B: Backend,
    B::Error: std::error::Error + Send + Sync + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, mut rx) = mpsc::channel::<FleetEvent>(QUEUE);
    let (receipt_tx, mut receipt_rx) = mpsc::channel::<String>(1);
    let mut feed = tokio::spawn(feed(tx.clone()));
    let hook = options.receipt.clone();
    let receipt_events = tx.clone();
    let mut receipts = tokio::spawn(async move {
        while let Some(sandbox) = receipt_rx.recv().await {
            let result = hook(sandbox.clone()).await.map(Box::new);
            if receipt_events
                .send(FleetEvent::Receipt { sandbox, result })
                .await
                .is_err()
            {
                return;
            }
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let input = spawn_input(tx, stop.clone()).map_err(TuiError::Input)?;

    let size = terminal.size().map_err(|e| TuiError::Draw(Box::new(e)))?;
    let mut app = FleetApp::new(options.via, options.rows, options.sandboxes, now_ms());
    app.size = (size.width, size.height);
    app.integrity = options.integrity;
    // The drilled-in sandbox and its activity when its receipt was asked.
    let mut receipt_for: Option<(String, u64)> = None;
    let mut receipt_at = Instant::now();
    let mut frame = tokio::time::interval(Duration::from_millis(1000 / FPS));
    frame.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut dirty = true;
    let mut drawn_second = 0;

    let result = 'outer: loop {
        tokio::select! {
            _ = &mut feed => break Err(TuiError::Source("stream feed")),
            _ = &mut receipts => break Err(TuiError::Source("receipt")),
            ev = rx.recv() => {
                let Some(ev) = ev else { break Ok(()) };
                let mut next = Some(ev);
                let mut n = 0;
                while let Some(ev) = next.take() {
                    match app.update(ev) {
                        Some(FleetAction::Quit) => break 'outer Ok(()),
                        Some(FleetAction::Receipt(sandbox)) => {
                            let seq = app.drill.as_ref().map_or(0, |d| d.app.activity_seq());
                            let _ = receipt_tx.try_send(sandbox.clone());
                            receipt_for = Some((sandbox, seq));
                            receipt_at = Instant::now();
                        }
                        None => {}
                    }
                    n += 1;
                    if n < MAX_DRAIN {
                        next = rx.try_recv().ok();
                    }
                }
                dirty = true;
            }
            _ = frame.tick() => {
                let now = now_ms();
                app.update(FleetEvent::Term(Event::Tick { now_ms: now }));
                // New lines of the drilled-in sandbox refresh its receipt
                // at most every `receipt_every`.
                if let Some(d) = &app.drill {
                    let seq = d.app.activity_seq();
                    let stale = receipt_for
                        .as_ref()
                        .is_none_or(|(s, at)| *s != d.sandbox || *at != seq);
                    if stale && receipt_at.elapsed() >= options.receipt_every {
                        let _ = receipt_tx.try_send(d.sandbox.clone());
                        receipt_for = Some((d.sandbox.clone(), seq));
                        receipt_at = Instant::now();
                    }
                }
                if dirty || now / 1000 != drawn_second {
                    if let Err(e) = terminal.draw(|f| render_fleet(&app, f)) {
                        break Err(TuiError::Draw(Box::new(e)));
                    }
                    dirty = false;
                    drawn_second = now / 1000;
                }
            }
        }
    };
    stop.store(true, Ordering::Relaxed);
    feed.abort();
    receipts.abort();
    drop(rx);
    if input.join().is_err() {
        warn!("the input thread panicked");
    }
    info!(
        sandboxes = app.len(),
        messages = app.messages,
        malformed = app.malformed_messages,
        "fleet tui stopped"
    );
    result
}

/// Reads keys and resizes on a thread (crossterm's reader blocks), checking
/// `stop` every 100 ms.
fn spawn_input<E: From<Event> + Send + 'static>(
    tx: mpsc::Sender<E>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("veris-tui-input".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let ev = match crossterm::event::poll(Duration::from_millis(100)) {
                    Ok(false) => continue,
                    Ok(true) => crossterm::event::read(),
                    Err(e) => Err(e),
                };
                let ev = match ev {
                    Ok(TermEvent::Key(k)) => Event::Key(k),
                    Ok(TermEvent::Resize(width, height)) => Event::Resize { width, height },
                    Ok(_) => continue,
                    Err(e) => {
                        // Without input nobody could quit: quit now.
                        warn!(error = %e, "reading terminal input failed; quitting");
                        Event::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL))
                    }
                };
                if tx.blocking_send(ev.into()).is_err() {
                    return;
                }
            }
        })
}

/// Takes the terminal: raw mode, the alternate screen, and a panic hook
/// (chained before the existing one) that gives the terminal back before the
/// panic message is printed.
pub fn enter_terminal() -> std::io::Result<ratatui::DefaultTerminal> {
    ratatui::try_init()
}

/// Gives the terminal back (leaves raw mode and the alternate screen).
pub fn leave_terminal() {
    ratatui::restore();
}
