//! Draws the fleet view ([`FleetApp`]): a header (what is read, how much,
//! what was skipped, and what the reader must do before trusting any of
//! it), one row per sandbox, a footer with the keys. A drilled-in sandbox
//! is drawn by [`crate::render::render`], as any other source's table.
//! Reads nothing but the state.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Style, Stylize};
use ratatui::text::{Line as TextLine, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row as TableRow, Table};
use ratatui::Frame;
use veris_receipt::quote::token;

use crate::app::ConnState;
use crate::fleet::{FleetApp, SandboxRow, MAX_GATEWAYS};
use crate::render::{duration_words, keep_end};

/// Draws the fleet view, or the sandbox drilled into.
pub fn render_fleet(app: &FleetApp, frame: &mut Frame) {
    if let Some(d) = &app.drill {
        crate::render::render(&d.app, frame);
        return;
    }
    let [header, table, footer] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    render_header(app, frame, header);
    render_table(app, frame, table);
    render_footer(app, frame, footer);
}

fn sep() -> Span<'static> {
    Span::raw(" │ ").dark_gray()
}

fn render_header(app: &FleetApp, frame: &mut Frame, area: Rect) {
    let conn = match &app.conn.state {
        ConnState::Connecting => Span::raw("○ connecting").yellow(),
        ConnState::Live => Span::raw("● live").green(),
        ConnState::Reconnecting { attempt, error } => {
            Span::raw(format!("◌ reconnecting #{attempt}: {error}")).yellow()
        }
        ConnState::Stopped(why) => Span::raw(format!("✗ stopped: {why}")).red(),
    };
    let mut line1 = vec![
        Span::raw(" veris ").bold().reversed(),
        Span::raw(" fleet "),
        sep(),
        Span::raw(format!(
            "{} sandboxes · {} gateways",
            app.len(),
            app.gateway_count()
        )),
        sep(),
        conn,
    ];
    let used: usize = line1.iter().map(|s| s.width()).sum();
    let room = usize::from(area.width).saturating_sub(used + 2);
    line1.push(Span::raw(format!("  {}", keep_end(&app.via, room))).dark_gray());
    let line2 = Span::raw(app.integrity.clone()).yellow();
    let mut line3 = vec![Span::raw(format!("{} messages", app.messages))];
    if app.malformed_messages > 0 || app.skipped_lines > 0 {
        line3.push(
            Span::raw(format!(
                " · skipped {} malformed messages, {} lines that are not ledger lines",
                app.malformed_messages, app.skipped_lines
            ))
            .red(),
        );
    }
    if app.forgotten > 0 {
        line3.push(Span::raw(format!(" · {} idle sandboxes forgotten", app.forgotten)).dark_gray());
    }
    if app.forgotten_chains > 0 {
        line3.push(
            Span::raw(format!(
                " · {} gateway chains forgotten (over {MAX_GATEWAYS} per sandbox)",
                app.forgotten_chains
            ))
            .red(),
        );
    }
    frame.render_widget(
        Paragraph::new(vec![
            TextLine::from(line1),
            TextLine::from(line2),
            TextLine::from(line3),
        ]),
        area,
    );
}

/// `stripe 3 · github 1`, most requests first.
fn twin_words(row: &SandboxRow) -> String {
    let mut v: Vec<(&String, &u64)> = row.services.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    v.iter()
        .map(|(name, n)| format!("{} {n}", token(name)))
        .collect::<Vec<_>>()
        .join(" · ")
}

fn render_table(app: &FleetApp, frame: &mut Frame, area: Rect) {
    let view = app.view();
    let block = Block::bordered()
        .title(if app.filter().is_empty() {
            " sandboxes ".to_string()
        } else {
            format!(
                " sandboxes matching {} ({}) ",
                token(app.filter()),
                view.len()
            )
        })
        .border_style(Style::new().dark_gray());
    let height = usize::from(area.height.saturating_sub(3)).max(1);
    let sel = app.selected_index(&view);
    let start = sel.saturating_sub(height - 1);
    let rows: Vec<TableRow> = view
        .iter()
        .enumerate()
        .skip(start)
        .take(height)
        .map(|(i, s)| {
            let gateways: Vec<String> = s.gateways().map(|g| token(g).into_owned()).collect();
            let age = duration_words(app.now_ms.saturating_sub(s.last_ms));
            let errors = Cell::from(s.errors.to_string());
            let row = TableRow::new(vec![
                Cell::from(token(&s.id).into_owned()),
                Cell::from(gateways.join(",")),
                Cell::from(s.requests.to_string()),
                if s.errors > 0 { errors.red() } else { errors },
                Cell::from(s.refused.to_string()),
                Cell::from(format!("{age} ago")),
                Cell::from(twin_words(s)),
            ]);
            if i == sel {
                row.reversed()
            } else {
                row
            }
        })
        .collect();
    if rows.is_empty() {
        let words = if app.is_empty() {
            "no sandbox has published lines in the window yet"
        } else {
            "no sandbox matches the filter (Esc clears it)"
        };
        let inner = block.inner(area);
        frame.render_widget(block, area);
        frame.render_widget(Paragraph::new(words).dark_gray(), inner);
        return;
    }
    let table = Table::new(
        rows,
        [
            Constraint::Length(24),
            Constraint::Length(16),
            Constraint::Length(7),
            Constraint::Length(6),
            Constraint::Length(7),
            Constraint::Length(10),
            Constraint::Min(10),
        ],
    )
    .header(
        TableRow::new(vec![
            "SANDBOX", "GATEWAYS", "REQS", "ERR", "REFUSED", "LAST", "TWIN",
        ])
        .bold(),
    )
    .block(block);
    frame.render_widget(table, area);
}

fn render_footer(app: &FleetApp, frame: &mut Frame, area: Rect) {
    let line = if let Some(input) = app.filter_input() {
        TextLine::from(vec![
            Span::raw(" / ").bold().reversed(),
            Span::raw(format!(" {}", token(input))),
            Span::raw("▏").cyan(),
            Span::raw("  a part of the sandbox id · Enter keeps · Esc clears").dark_gray(),
        ])
    } else {
        let mut spans = Vec::new();
        for (k, what) in [
            ("q", "quit"),
            ("jk↑↓", "move"),
            ("Enter", "open sandbox"),
            ("/", "filter"),
        ] {
            spans.push(Span::raw(format!(" {k} ")).bold().reversed());
            spans.push(Span::raw(format!(" {what} ")));
        }
        TextLine::from(spans)
    };
    frame.render_widget(Paragraph::new(line), area);
}
