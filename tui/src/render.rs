//! The pure render function: [`render`] draws an [`App`] into a frame and
//! reads nothing else — no clock, no I/O — so a state always draws the same
//! screen (the snapshot tests rely on it). Only the visible window of the
//! table is built, whatever the number of rows.

use ratatui::layout::{Alignment, Constraint, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line as TextLine, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row as TableRow, Table, Wrap};
use ratatui::Frame;
use veris_receipt::quote::{escaped, quoted, token};
use veris_receipt::receipt::{integrity_text, CheckStatus, IntegrityStatus, Interception};
use veris_receipt::{
    BlockedLine, CheckLine, PassthroughLine, RequestLine, ReservedPathLine, ResponseIncompleteLine,
    SessionLine, TlsAbandonedLine, TrustFailureLine, TunnelCloseLine, UpstreamErrorLine,
};
use veris_receipt::{Entry, Mode};

use crate::app::{App, ConnState, Row, SPARK_SECONDS};
use crate::layout::{self, WIDE};

const SPARK: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Draws the whole screen.
pub fn render(app: &App, frame: &mut Frame) {
    let areas = layout::areas(frame.area(), app);
    render_header(app, frame, areas.header);
    render_services(app, frame, areas.services);
    if areas.table.height > 0 {
        render_table(app, frame, areas.table);
    }
    if let Some(area) = areas.detail {
        render_detail(app, frame, area);
    }
    render_footer(app, frame, areas.footer);
}

fn mode_word(m: Mode) -> &'static str {
    match m {
        Mode::Passthrough => "passthrough",
        Mode::Strict => "strict",
    }
}

/// `5m12s`, `1h02m`, `12s`.
pub fn duration_words(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// `512B`, `1.5K`, `12M`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["K", "M", "G", "T"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if v < 10.0 {
        format!("{v:.1}{}", UNITS[unit])
    } else {
        format!("{v:.0}{}", UNITS[unit])
    }
}

/// `s` cut from the left to `room` characters, with `…` when cut.
pub fn keep_end(s: &str, room: usize) -> String {
    let n = s.chars().count();
    if n <= room {
        return s.to_string();
    }
    if room == 0 {
        return String::new();
    }
    let tail: String = s.chars().skip(n - (room - 1)).collect();
    format!("…{tail}")
}

fn latency(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

fn status_style(status: u16) -> Style {
    match status / 100 {
        2 => Style::new().fg(Color::Green),
        3 => Style::new().fg(Color::Cyan),
        4 => Style::new().fg(Color::Yellow),
        5 => Style::new().fg(Color::Red),
        _ => Style::new(),
    }
}

fn sep() -> Span<'static> {
    Span::raw(" │ ").dark_gray()
}

fn render_header(app: &App, frame: &mut Frame, area: Rect) {
    let receipt = app.receipt.as_ref();
    let twin = receipt
        .and_then(|r| r.twin.clone())
        .or_else(|| app.session.as_ref().map(|s| s.sandbox_id.clone()))
        .map(|t| token(&t).into_owned())
        .unwrap_or_else(|| "?".into());
    let mode = receipt
        .and_then(|r| r.mode)
        .or(app.session.as_ref().map(|s| s.mode));
    let interception = receipt
        .and_then(|r| r.interception)
        .or(app.session.as_ref().map(|s| s.interception));
    let uptime = app
        .uptime_ms()
        .map(|ms| format!("up {}", duration_words(ms)))
        .unwrap_or_else(|| "up ?".into());
    let conn = match &app.conn.state {
        ConnState::Connecting => Span::raw("○ connecting").yellow(),
        // Following a ledger whose session has ended is not watching a
        // live proxy.
        ConnState::Live if app.ended() => Span::raw("■ ended").dark_gray(),
        ConnState::Live => Span::raw("● live").green(),
        ConnState::Reconnecting { attempt, error } => {
            Span::raw(format!("◌ reconnecting #{attempt}: {error}")).yellow()
        }
        ConnState::Stopped(why) => Span::raw(format!("✗ stopped: {why}")).red(),
    };
    let mut line1 = vec![
        Span::raw(" veris ").bold().reversed(),
        Span::raw(" twin "),
        Span::raw(twin).bold(),
        sep(),
        Span::raw(format!(
            "{} · {}",
            mode.map_or("mode ?", mode_word),
            interception.map_or("interception ?", Interception::word)
        )),
        sep(),
        Span::raw(uptime),
        sep(),
        conn,
    ];
    let used: usize = line1.iter().map(|s| s.width()).sum();
    let room = usize::from(area.width).saturating_sub(used + 2);
    line1.push(Span::raw(format!("  {}", keep_end(&app.conn.via, room))).dark_gray());
    let line1 = TextLine::from(line1);

    let integrity = match receipt {
        None => match &app.receipt_error {
            Some(e) => vec![
                Span::raw("integrity: unknown").yellow(),
                Span::raw(format!(" — {e}")),
            ],
            None => vec![Span::raw("integrity: pending (r to fetch the receipt)").dark_gray()],
        },
        Some(r) => match r.integrity.status {
            IntegrityStatus::Verified => vec![Span::raw("integrity: verified").green().bold()],
            IntegrityStatus::Failed => {
                let why = r
                    .integrity
                    .checks
                    .iter()
                    .find(|c| c.status == CheckStatus::Failed)
                    .map(|c| format!("{}: {}", c.name, escaped(&c.detail)))
                    .or_else(|| {
                        r.integrity
                            .reason
                            .as_deref()
                            .map(|r| escaped(r).into_owned())
                    })
                    .unwrap_or_default();
                vec![
                    Span::raw("integrity: FAILED").red().bold(),
                    Span::raw(format!(" — {why}")).red(),
                ]
            }
            // The receipt's own words, reason included.
            IntegrityStatus::Unverified => {
                vec![Span::raw(format!("integrity: {}", integrity_text(&r.integrity))).yellow()]
            }
        },
    };
    let line2 = TextLine::from(integrity);

    let leaks = match receipt {
        Some(r) if r.leaks.is_empty() => Span::raw("leaks: none").green(),
        Some(r) => Span::raw(format!("leaks: {}", escaped(&r.leaks.join(", ")))).yellow(),
        None => Span::raw("leaks: ?").dark_gray(),
    };
    let mut line3 = vec![leaks, sep(), Span::raw(format!("seq {}", app.last_seq()))];
    if app.dropped > 0 {
        line3.push(Span::raw(format!(" · {} older rows dropped", app.dropped)).dark_gray());
    }
    if app.gaps > 0 {
        line3.push(Span::raw(format!(" · {} seqs missing", app.gaps)).red());
    }
    frame.render_widget(
        Paragraph::new(vec![line1, line2, TextLine::from(line3)]),
        area,
    );
}

fn render_services(app: &App, frame: &mut Frame, area: Rect) {
    let services = app.services();
    let cap = layout::service_lines_cap(frame.area().height);
    let title = if services.len() > cap {
        format!(" services (+{} more) ", services.len() - cap)
    } else {
        " services ".to_string()
    };
    let c = &app.counts;
    let others = Span::raw(format!(
        " passthrough {} · blocked {} · trust failures {} ",
        c.passthrough, c.blocked, c.trust_failures
    ));
    let others = if c.trust_failures > 0 {
        others.red()
    } else if c.blocked > 0 {
        others.yellow()
    } else {
        others.gray()
    };
    let block = Block::bordered()
        .title(title)
        .title_top(TextLine::from(others).right_aligned())
        .border_style(Style::new().dark_gray());
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if services.is_empty() {
        frame.render_widget(Paragraph::new("no vendor traffic yet").dark_gray(), inner);
        return;
    }
    let now_s = app.ledger_now_ms().div_euclid(1000);
    let name_w = services
        .keys()
        .map(|k| k.len())
        .max()
        .unwrap_or(0)
        .clamp(6, 20);
    // name, counts and p50 take this much; the sparkline gets the rest.
    let fixed = name_w + 37;
    let spark_w = usize::from(inner.width).saturating_sub(fixed + 1);
    let lines: Vec<TextLine> = services
        .iter()
        .take(cap)
        .map(|(name, s)| {
            let name = token(name);
            let p50 = s.p50_ms().map_or("-".to_string(), latency);
            let mut spans = vec![
                Span::raw(format!("{name:<name_w$.name_w$}")).bold(),
                Span::raw(format!(" {:>7} req", s.requests)),
                if s.errors > 0 {
                    Span::raw(format!(" {:>6} err", s.errors)).red()
                } else {
                    Span::raw(format!(" {:>6} err", 0)).dark_gray()
                },
                Span::raw(format!("  p50 {p50:>6} ")),
            ];
            if spark_w >= 10 {
                let rate = s.rate(now_s);
                spans.push(Span::raw(sparkline(&rate, spark_w)).cyan());
            }
            TextLine::from(spans)
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}

/// The last minute of per-second counts in at most `width` characters,
/// merging seconds when narrower than [`SPARK_SECONDS`]; scaled to its peak.
pub fn sparkline(rate: &[u32; SPARK_SECONDS], width: usize) -> String {
    let per = SPARK_SECONDS.div_ceil(width.max(1));
    let cols: Vec<u32> = rate.rchunks(per).rev().map(|c| c.iter().sum()).collect();
    let peak = cols.iter().copied().max().unwrap_or(0);
    let mut out: String = cols
        .iter()
        .map(|&v| {
            if peak == 0 || v == 0 {
                SPARK[0]
            } else {
                // v <= peak, so the index is in 1..=8.
                SPARK[(1 + (v as u64 * 7) / peak as u64) as usize]
            }
        })
        .collect();
    out.push_str(&format!(" {}/s", rate[SPARK_SECONDS - 1]));
    out
}

/// Table columns for the table's width: compact under [`COMPACT`] columns,
/// with a host column from [`WIDE`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Columns {
    Compact,
    Full,
    Wide,
}

/// Terminals narrower than this get the compact table.
const COMPACT: u16 = 100;

impl Columns {
    fn for_width(w: u16) -> Columns {
        if w >= WIDE {
            Columns::Wide
        } else if w >= COMPACT {
            Columns::Full
        } else {
            Columns::Compact
        }
    }
}

fn row_cells(row: &Row, cols: Columns) -> Vec<Cell<'static>> {
    let time = if cols == Columns::Compact {
        row.ts.get(11..19)
    } else {
        row.ts.get(11..23)
    }
    .unwrap_or(&row.ts)
    .to_string();
    let label_style = match &row.entry {
        Entry::Request(_) => Style::new(),
        Entry::Passthrough(_) | Entry::Ech { .. } | Entry::Quic { .. } => {
            Style::new().fg(Color::Blue)
        }
        Entry::Blocked(_)
        | Entry::TrustFailure(_)
        | Entry::UpstreamError(_)
        | Entry::ReservedPath(_)
        | Entry::Tamper { .. } => Style::new().fg(Color::Red),
        Entry::RedirectChange { .. } => Style::new().fg(Color::Red),
        Entry::Session(_)
        | Entry::Seal { .. }
        | Entry::Check(_)
        | Entry::UdpDropped { .. }
        | Entry::Dns { .. }
        | Entry::TlsAbandoned(_) => Style::new().fg(Color::DarkGray),
        Entry::ResponseIncomplete(_) => Style::new().fg(Color::Red),
        Entry::TunnelClose(_) | Entry::BodyCapture { .. } => Style::new().fg(Color::DarkGray),
        Entry::Callback(_) => Style::new().fg(Color::Magenta),
        Entry::CallbackDropped(_) => Style::new().fg(Color::Red),
    };
    let (method, what, status, lat, bytes): (String, String, Cell, String, String) =
        match &row.entry {
            Entry::Request(r) => (
                if r.websocket {
                    format!("{} ws", token(&r.method))
                } else {
                    token(&r.method).into_owned()
                },
                match &r.query {
                    Some(q) => quoted(&format!("{}?{q}", r.path)),
                    None => quoted(&r.path),
                },
                Cell::from(r.status.to_string()).style(status_style(r.status)),
                latency(r.duration_ms),
                format!(
                    "{}/{}",
                    human_bytes(r.bytes_in),
                    r.bytes_out.map_or("?".into(), human_bytes)
                ),
            ),
            Entry::UpstreamError(e) => (
                token(&e.method).into_owned(),
                format!("{}  {}", quoted(&e.path), token(&e.error)),
                Cell::from(e.status.to_string()).style(status_style(e.status).bold()),
                latency(e.duration_ms),
                String::new(),
            ),
            Entry::Passthrough(p) => (
                "TUNNEL".into(),
                format!("{}:{}", quoted(&p.host), p.port),
                Cell::from("tun").dark_gray(),
                latency(p.duration_ms),
                format!("{}/{}", human_bytes(p.bytes_in), human_bytes(p.bytes_out)),
            ),
            Entry::Blocked(b) => (
                b.method
                    .as_deref()
                    .map_or("CONNECT".into(), |m| token(m).into_owned()),
                match &b.path {
                    Some(p) => format!("{}:{} {}", quoted(&b.host), b.port, quoted(p)),
                    None => format!("{}:{}", quoted(&b.host), b.port),
                },
                Cell::from("421").style(status_style(421).bold()),
                String::new(),
                String::new(),
            ),
            Entry::TrustFailure(TrustFailureLine {
                host, port, alert, ..
            }) => (
                "TLS".into(),
                format!(
                    "{}:{port}  client refused the veris CA ({})",
                    quoted(host),
                    token(alert)
                ),
                Cell::from("tls").red().bold(),
                String::new(),
                String::new(),
            ),
            Entry::Callback(c) => (
                format!("←{}", token(&c.method)),
                format!(
                    "{}  {} #{}{}",
                    quoted(&c.path),
                    quoted(&c.event),
                    c.attempt,
                    callback_mark(c)
                ),
                match c.status {
                    Some(s) => Cell::from(s.to_string()).style(status_style(s)),
                    None => Cell::from("err").red().bold(),
                },
                latency(c.duration_ms),
                String::new(),
            ),
            Entry::BodyCapture { of, .. } => (
                String::new(),
                format!("bodies of #{of} captured"),
                Cell::from("cap").dark_gray(),
                String::new(),
                String::new(),
            ),
            Entry::TunnelClose(t) => (
                String::new(),
                match &t.error {
                    Some(e) => format!("tunnel #{} closed ({})", t.of, escaped(e)),
                    None => format!("tunnel #{} closed", t.of),
                },
                Cell::from("tun").dark_gray(),
                latency(t.duration_ms),
                format!("{}/{}", human_bytes(t.bytes_in), human_bytes(t.bytes_out)),
            ),
            Entry::ResponseIncomplete(ResponseIncompleteLine {
                of,
                bytes,
                declared,
                reason,
                ..
            }) => (
                String::new(),
                match declared {
                    Some(d) => format!(
                        "response of #{of} incomplete ({}): {bytes} of {d} bytes",
                        token(reason)
                    ),
                    None => format!(
                        "response of #{of} incomplete ({}): {bytes} bytes",
                        token(reason)
                    ),
                },
                Cell::from("cut").red(),
                String::new(),
                String::new(),
            ),
            Entry::TlsAbandoned(TlsAbandonedLine {
                host, port, stage, ..
            }) => (
                "TLS".into(),
                format!(
                    "{}:{port}  client left after our certificate ({}), no refusal alert",
                    quoted(host),
                    token(stage)
                ),
                Cell::from("tls"),
                String::new(),
                String::new(),
            ),
            Entry::Session(SessionLine { pid, listen, .. }) => (
                String::new(),
                format!("proxy started (pid {pid}, listening on {})", token(listen)),
                Cell::from(""),
                String::new(),
                String::new(),
            ),
            Entry::Quic {
                host,
                dst,
                attempts,
            } => (
                "UDP".into(),
                format!(
                    "{}{}  {attempts} QUIC attempt(s) dropped",
                    host.as_deref()
                        .map(|h| format!("{} ", quoted(h)))
                        .unwrap_or_default(),
                    token(dst)
                ),
                Cell::from("quic").dark_gray(),
                String::new(),
                String::new(),
            ),
            Entry::Ech { host, port, .. } => (
                "TLS".into(),
                format!("{}:{port}  ClientHello carried ECH", quoted(host)),
                Cell::from("ech").yellow(),
                String::new(),
                String::new(),
            ),
            Entry::ReservedPath(r) => (
                token(&r.method).into_owned(),
                format!(
                    "{}  {} (answered by the proxy)",
                    quoted(&r.path),
                    token(&r.error)
                ),
                Cell::from(r.status.to_string()).style(status_style(r.status)),
                String::new(),
                String::new(),
            ),
            Entry::Tamper { what, .. } => (
                String::new(),
                format!("ledger file {} behind the proxy's back", escaped(what)),
                Cell::from("!").red().bold(),
                String::new(),
                String::new(),
            ),
            Entry::RedirectChange { detail } => (
                String::new(),
                format!("kernel rules changed: {}", escaped(detail)),
                Cell::from("!").red().bold(),
                String::new(),
                String::new(),
            ),
            Entry::Dns {
                name,
                qtype,
                refused,
            } => (
                token(qtype).into_owned(),
                if *refused {
                    format!(
                        "DNS {} refused by the stub (its table of names is full)",
                        quoted(name)
                    )
                } else {
                    format!("DNS {} (answered by the stub)", quoted(name))
                },
                Cell::from(""),
                String::new(),
                String::new(),
            ),
            Entry::CallbackDropped(d) => (
                String::new(),
                format!(
                    "{} webhook event(s) dropped ({})",
                    d.events,
                    token(&d.reason)
                ),
                Cell::from("drop").red().bold(),
                String::new(),
                String::new(),
            ),
            Entry::UdpDropped { packets } => (
                String::new(),
                format!("{packets} UDP datagram(s) dropped by the rules"),
                Cell::from(""),
                String::new(),
                String::new(),
            ),
            Entry::Check(CheckLine { name, status, .. }) => (
                String::new(),
                format!("{}: {}", token(name), escaped(status)),
                Cell::from(""),
                String::new(),
                String::new(),
            ),
            Entry::Seal { sealed_seq, .. } => (
                String::new(),
                format!("sealed through seq {sealed_seq}"),
                Cell::from(""),
                String::new(),
                String::new(),
            ),
        };
    let mut cells = vec![
        Cell::from(time).dark_gray(),
        Cell::from(token(row.label()).into_owned()).style(label_style),
        Cell::from(method),
    ];
    if cols == Columns::Wide {
        cells.push(Cell::from(row.host().map(quoted).unwrap_or_default()));
    }
    cells.extend([
        Cell::from(what),
        status,
        Cell::from(TextLine::from(lat).alignment(Alignment::Right)),
        Cell::from(TextLine::from(bytes).alignment(Alignment::Right)),
    ]);
    cells
}

fn render_table(app: &App, frame: &mut Frame, area: Rect) {
    let shown = app.visible_len();
    let mut title = vec![Span::raw(format!(" requests {shown} "))];
    if app.paused() {
        title.push(
            Span::raw(format!("· PAUSED (+{} new, p to resume) ", app.held_back()))
                .yellow()
                .bold(),
        );
    } else if app.following() {
        title.push(Span::raw("· following ").green());
    } else {
        title.push(Span::raw("· scrolled (G to follow) ").yellow());
    }
    if !app.filter().is_empty() {
        title.push(Span::raw(format!("· filter: {} ", app.filter().text())).cyan());
    }
    let block = Block::bordered()
        .title(TextLine::from(title))
        .border_style(Style::new().dark_gray());
    if shown == 0 {
        let inner = block.inner(area);
        frame.render_widget(block, area);
        let text = if let Some(n) = &app.notice {
            n.clone()
        } else if app.rows_len() == 0 {
            "waiting for traffic — nothing has reached the twin yet".to_string()
        } else if app.paused() {
            "paused before the first row: p to resume".to_string()
        } else {
            "no rows match the filter (Esc clears it)".to_string()
        };
        let y = inner.y + inner.height / 2;
        if inner.height > 0 {
            frame.render_widget(
                Paragraph::new(text)
                    .dark_gray()
                    .alignment(Alignment::Center),
                Rect::new(inner.x, y, inner.width, 1),
            );
        }
        return;
    }
    let cols = Columns::for_width(area.width);
    let height = usize::from(area.height.saturating_sub(3)).max(1);
    let start = app.window_start(height);
    let selected = app.selected_index();
    let rows: Vec<TableRow> = (start..(start + height).min(shown))
        .filter_map(|i| {
            let row = app.visible_row(i)?;
            let r = TableRow::new(row_cells(row, cols));
            Some(if Some(i) == selected {
                r.style(Style::new().add_modifier(Modifier::REVERSED))
            } else {
                r
            })
        })
        .collect();
    let (widths, header): (Vec<Constraint>, Vec<&str>) = match cols {
        Columns::Compact => (
            vec![
                Constraint::Length(8),
                Constraint::Length(12),
                Constraint::Length(6),
                Constraint::Fill(1),
                Constraint::Length(4),
                Constraint::Length(6),
                Constraint::Length(9),
            ],
            vec!["time", "service", "method", "path", "st", "lat", "in/out"],
        ),
        Columns::Full | Columns::Wide => {
            let mut w = vec![
                Constraint::Length(12),
                Constraint::Length(16),
                Constraint::Length(7),
            ];
            let mut h = vec!["time", "service", "method"];
            if cols == Columns::Wide {
                w.push(Constraint::Length(22));
                h.push("host");
            }
            w.extend([
                Constraint::Fill(1),
                Constraint::Length(6),
                Constraint::Length(7),
                Constraint::Length(11),
            ]);
            h.extend(["path", "status", "latency", "in/out"]);
            (w, h)
        }
    };
    let header = TableRow::new(header.into_iter().map(Cell::from)).style(Style::new().bold());
    frame.render_widget(Table::new(rows, widths).header(header).block(block), area);
}

fn render_detail(app: &App, frame: &mut Frame, area: Rect) {
    let Some(row) = app.selected_row() else {
        frame.render_widget(
            Paragraph::new("no row selected").block(Block::bordered().title(" detail ")),
            area,
        );
        return;
    };
    let key = |k: &str| Span::raw(format!("{k:<9}")).dark_gray();
    // Recorded values are quoted (names) or escaped (sentences) below.
    let kv = |k: &str, v: String| TextLine::from(vec![key(k), Span::raw(v)]);
    let mut lines = vec![kv("ledger", format!("seq {} · {}", row.seq, row.ts))];
    lines.push(kv("kind", row.entry.kind().to_string()));
    match &row.entry {
        Entry::Request(RequestLine {
            service,
            host,
            method,
            path,
            query,
            status,
            http,
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            duration_us: _,
            upstream,
            headers,
            websocket,
            client_gone,
        }) => {
            lines.push(kv("service", token(service).into_owned()));
            lines.push(kv("host", quoted(host)));
            lines.push(kv(
                "request",
                format!(
                    "{} {}",
                    token(method),
                    quoted(&format!(
                        "{path}{}",
                        query
                            .as_deref()
                            .map(|q| format!("?{q}"))
                            .unwrap_or_default()
                    ))
                ),
            ));
            lines.push(TextLine::from(vec![
                key("status"),
                Span::styled(status.to_string(), status_style(*status)),
                Span::raw(format!(
                    " · {http}{}{}",
                    if *websocket { " · websocket" } else { "" },
                    if *client_gone {
                        " · client gone before the answer"
                    } else {
                        ""
                    }
                )),
            ]));
            lines.push(kv("tier", tier.word().to_string()));
            lines.push(kv(
                "timing",
                format!("{} to the twin's response head", latency(*duration_ms)),
            ));
            lines.push(kv(
                "bytes",
                format!(
                    "in {} · out {}",
                    human_bytes(*bytes_in),
                    bytes_out.map_or("not declared".into(), human_bytes)
                ),
            ));
            lines.push(kv("upstream", quoted(upstream)));
            if headers.is_empty() {
                lines.push(kv("headers", "none recorded".into()));
            } else {
                lines.push(kv("headers", String::new()));
                for (name, value) in headers {
                    lines.push(TextLine::from(format!(
                        "  {}: {}",
                        token(name),
                        quoted(value)
                    )));
                }
            }
        }
        Entry::UpstreamError(UpstreamErrorLine {
            service,
            host,
            method,
            path,
            upstream,
            status,
            error,
            tier,
            duration_ms,
            bytes_in,
            declared_in,
        }) => {
            lines.push(kv("service", token(service).into_owned()));
            lines.push(kv("host", quoted(host)));
            lines.push(kv("request", format!("{} {}", token(method), quoted(path))));
            let meaning = match error.as_str() {
                "veris_upstream_timeout" => "no answer in time: the twin may have processed it",
                "veris_request_body_incomplete" => {
                    "the client never finished its body: the twin may have processed it"
                }
                "veris_session_ended" => {
                    "the session ended before the twin answered: it may have processed it"
                }
                _ => "did not reach the twin",
            };
            if let Some(b) = bytes_in {
                let of = declared_in.map_or(String::new(), |d| format!(" of {d}"));
                lines.push(kv("body", format!("{b}{of} bytes sent")));
            }
            lines.push(kv("status", format!("{status} · {error} ({meaning})")));
            lines.push(kv("tier", tier.word().to_string()));
            lines.push(kv("timing", latency(*duration_ms)));
            lines.push(kv("upstream", quoted(upstream)));
        }
        Entry::Passthrough(PassthroughLine {
            host,
            port,
            tier,
            bytes_in,
            bytes_out,
            duration_ms,
            reason,
            dst,
        }) => {
            lines.push(kv("host", format!("{}:{port}", quoted(host))));
            if let Some(dst) = dst {
                lines.push(kv("dialed", token(dst).into_owned()));
            }
            lines.push(kv("why", format!("tunneled to the real host ({reason})")));
            lines.push(kv("tier", tier.word().to_string()));
            lines.push(kv("timing", format!("{} open", latency(*duration_ms))));
            lines.push(kv(
                "bytes",
                format!(
                    "in {} · out {}",
                    human_bytes(*bytes_in),
                    human_bytes(*bytes_out)
                ),
            ));
        }
        Entry::Blocked(BlockedLine {
            host,
            port,
            tier,
            method,
            path,
            reason,
            dst,
        }) => {
            lines.push(kv("host", format!("{}:{port}", quoted(host))));
            if let Some(dst) = dst {
                lines.push(kv("dst", token(dst).into_owned()));
            }
            if let (Some(m), Some(p)) = (method, path) {
                lines.push(kv("request", format!("{} {}", token(m), quoted(p))));
            }
            lines.push(kv("status", format!("421 refused ({reason})")));
            lines.push(kv("tier", tier.word().to_string()));
        }
        Entry::BodyCapture { of, .. } => {
            lines.push(kv("request", format!("#{of}")));
        }
        Entry::Callback(c) => {
            lines.push(kv("service", quoted(&c.service)));
            lines.push(kv(
                "event",
                format!("{} {}", quoted(&c.event), quoted(&c.event_id)),
            ));
            lines.push(kv(
                "delivery",
                format!(
                    "{} {} {}",
                    token(&c.method),
                    quoted(&c.target),
                    quoted(&c.path)
                ),
            ));
            lines.push(kv(
                "status",
                match (c.status, &c.error) {
                    (Some(s), None) => s.to_string(),
                    (Some(s), Some(e)) => format!("{s} ({})", escaped(e)),
                    (None, Some(e)) => escaped(e).into_owned(),
                    (None, None) => "none".into(),
                },
            ));
            lines.push(kv(
                "attempt",
                format!("{} · origin {}", c.attempt, token(&c.origin)),
            ));
            if let Some(fault) = &c.fault {
                lines.push(kv("fault", format!("{} (not counted)", quoted(fault))));
            } else if c.origin != "twin" {
                lines.push(kv("counted", "no: not the twin's own event".into()));
            }
            lines.push(kv("duration", latency(c.duration_ms)));
        }
        Entry::TunnelClose(TunnelCloseLine {
            of,
            bytes_in,
            bytes_out,
            duration_ms,
            error,
        }) => {
            lines.push(kv("tunnel", format!("#{of}")));
            lines.push(kv(
                "bytes",
                format!("{bytes_in} from the client, {bytes_out} to it"),
            ));
            lines.push(kv("open for", format!("{duration_ms} ms")));
            if let Some(e) = error {
                lines.push(kv("error", escaped(e).into_owned()));
            }
        }
        Entry::ResponseIncomplete(ResponseIncompleteLine {
            of,
            service,
            bytes,
            declared,
            reason,
        }) => {
            lines.push(kv("request", format!("#{of} ({})", token(service))));
            lines.push(kv("delivered", format!("{bytes} bytes")));
            if let Some(d) = declared {
                lines.push(kv("declared", format!("{d} bytes")));
            }
            lines.push(kv("reason", token(reason).into_owned()));
        }
        Entry::TlsAbandoned(TlsAbandonedLine {
            host,
            port,
            tier,
            service,
            stage,
            alert,
            alpn,
        }) => {
            lines.push(kv("host", format!("{}:{port}", quoted(host))));
            if let Some(s) = service {
                lines.push(kv("service", token(s).into_owned()));
            }
            lines.push(kv("stage", token(stage).into_owned()));
            lines.push(kv("alert", alert.clone().unwrap_or_else(|| "none".into())));
            if let Some(alpn) = alpn {
                lines.push(kv("alpn", token(alpn).into_owned()));
            }
            lines.push(kv("tier", tier.word().to_string()));
        }
        Entry::TrustFailure(TrustFailureLine {
            host,
            port,
            tier,
            service,
            alert,
        }) => {
            lines.push(kv("host", format!("{}:{port}", quoted(host))));
            if let Some(s) = service {
                lines.push(kv("service", token(s).into_owned()));
            }
            lines.push(kv("alert", token(alert).into_owned()));
            lines.push(kv("tier", tier.word().to_string()));
            lines.push(kv(
                "meaning",
                "the client does not trust the veris CA for this host".into(),
            ));
        }
        Entry::Session(SessionLine {
            run_id,
            sandbox_id,
            mode,
            tier,
            twin,
            pid,
            version,
            listen,
            recovered_torn_tail,
            key_id,
            moved_aside,
            ..
        }) => {
            lines.push(kv("twin", format!("{sandbox_id} at {twin}")));
            lines.push(kv(
                "mode",
                format!("{} · {}", mode_word(*mode), tier.word()),
            ));
            lines.push(kv(
                "proxy",
                format!("pid {pid} · {listen} · veris {version}"),
            ));
            lines.push(kv("run", run_id.clone()));
            if let Some(t) = recovered_torn_tail {
                lines.push(kv(
                    "recovered",
                    format!("torn line {} ({} bytes) set aside", t.line, t.bytes),
                ));
            }
            if let Some(k) = key_id {
                lines.push(kv("seal key", k.clone()));
            }
            if let Some(m) = moved_aside {
                lines.push(kv(
                    "moved",
                    format!("earlier ledger moved to {} ({})", m.file, m.why),
                ));
            }
        }
        Entry::Quic {
            host,
            dst,
            attempts,
        } => {
            lines.push(kv(
                "host",
                host.as_deref().map_or("(no SNI)".into(), quoted),
            ));
            lines.push(kv("dst", token(dst).into_owned()));
            lines.push(kv("attempts", attempts.to_string()));
        }
        Entry::Ech {
            host, port, tier, ..
        } => {
            lines.push(kv("host", format!("{}:{port}", quoted(host))));
            lines.push(kv("tier", tier.word().to_string()));
        }
        Entry::Seal { sealed_seq, .. } => lines.push(kv("sealed", sealed_seq.to_string())),
        Entry::ReservedPath(ReservedPathLine {
            service,
            host,
            method,
            path,
            status,
            error,
            tier,
        }) => {
            lines.push(kv("service", token(service).into_owned()));
            lines.push(kv("host", quoted(host)));
            lines.push(kv("request", format!("{} {}", token(method), quoted(path))));
            lines.push(kv(
                "status",
                format!("{status} · {error} (answered by the proxy, never sent to the twin)"),
            ));
            lines.push(kv("tier", tier.word().to_string()));
        }
        Entry::RedirectChange { detail } => {
            lines.push(kv(
                "rules",
                "the kernel redirect changed while the proxy ran".into(),
            ));
            lines.push(kv("detail", escaped(detail).into_owned()));
        }
        Entry::UdpDropped { packets } => {
            lines.push(kv("dropped", format!("{packets} datagram(s)")))
        }
        Entry::CallbackDropped(d) => {
            lines.push(kv("service", quoted(&d.service)));
            lines.push(kv(
                "dropped",
                format!(
                    "{} webhook event(s), never delivered ({})",
                    d.events,
                    token(&d.reason)
                ),
            ));
        }
        Entry::Dns {
            name,
            qtype,
            refused,
        } => {
            lines.push(kv("name", quoted(name)));
            lines.push(kv("type", token(qtype).into_owned()));
            if *refused {
                lines.push(kv(
                    "refused",
                    "the stub's table of names was full (SERVFAIL)".to_string(),
                ));
            }
        }
        Entry::Tamper { what, detail } => {
            lines.push(kv("tamper", escaped(what).into_owned()));
            lines.push(kv("detail", escaped(detail).into_owned()));
        }
        Entry::Check(CheckLine {
            name,
            status,
            detail,
            since_seq,
            until_seq,
        }) => {
            lines.push(kv("check", format!("{}: {}", token(name), escaped(status))));
            lines.push(kv("window", format!("seq {since_seq}..{until_seq}")));
            lines.push(kv("detail", escaped(detail).into_owned()));
        }
    }
    frame.render_widget(
        Paragraph::new(lines).wrap(Wrap { trim: false }).block(
            Block::bordered()
                .title(format!(" detail · seq {} (Esc closes) ", row.seq))
                .border_style(Style::new().cyan()),
        ),
        area,
    );
}

fn render_footer(app: &App, frame: &mut Frame, area: Rect) {
    let line = if let Some(input) = app.filter_input() {
        TextLine::from(vec![
            Span::raw(" / ").bold().reversed(),
            Span::raw(format!(" {input}")),
            Span::raw("▏").cyan(),
            Span::raw("  Enter keeps · Esc clears · service:NAME 4xx kind:blocked text")
                .dark_gray(),
        ])
    } else {
        let mut spans = Vec::new();
        let fleet = [("Esc", "fleet"), ("Tab", "gateway")];
        for (k, what) in [
            ("q", "quit"),
            ("jk↑↓", "move"),
            ("gG", "ends"),
            ("Enter", "detail"),
            ("/", "filter"),
            ("p", "pause"),
            ("r", "receipt"),
        ]
        .iter()
        .chain(fleet.iter().filter(|_| app.nested))
        {
            spans.push(Span::raw(format!(" {k} ")).bold().reversed());
            spans.push(Span::raw(format!(" {what} ")));
        }
        TextLine::from(spans)
    };
    frame.render_widget(Paragraph::new(line), area);
}

/// A callback row's mark when its delivery does not count toward a
/// requirement: its origin, and its fault (`--webhook-faults`).
fn callback_mark(c: &veris_receipt::CallbackLine) -> String {
    match (c.origin.as_str(), &c.fault) {
        ("twin", None) => String::new(),
        (origin, None) => format!("  [{}]", token(origin)),
        (origin, Some(f)) => format!("  [{} fault {}]", token(origin), quoted(f)),
    }
}
