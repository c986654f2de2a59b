//! Where each part of the screen goes for a terminal size. Shared by the
//! renderer and by `App::update` (a page move needs the table's height), so
//! the two never disagree.

use ratatui::layout::{Constraint, Layout, Rect};

use crate::app::App;

/// Header lines above the services panel.
pub const HEADER_LINES: u16 = 3;

/// Terminals at least this wide show the host column and put the detail
/// pane beside the table instead of under it.
pub const WIDE: u16 = 120;

pub struct Areas {
    pub header: Rect,
    pub services: Rect,
    pub table: Rect,
    pub detail: Option<Rect>,
    pub footer: Rect,
}

/// Service lines the panel shows at most (the rest are counted in its title).
pub fn service_lines_cap(height: u16) -> usize {
    if height >= 40 {
        8
    } else {
        4
    }
}

pub fn areas(area: Rect, app: &App) -> Areas {
    let n = app
        .services()
        .len()
        .clamp(1, service_lines_cap(area.height));
    let [header, services, body, footer] = Layout::vertical([
        Constraint::Length(HEADER_LINES),
        Constraint::Length(n as u16 + 2),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    let (table, detail) = if !app.detail {
        (body, None)
    } else if area.width >= WIDE {
        let [t, d] = Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)])
            .areas(body);
        (t, Some(d))
    } else if area.height < 36 {
        // No room for both: the detail takes the body; j/k still move the
        // selection it shows.
        (Rect::new(body.x, body.y, body.width, 0), Some(body))
    } else {
        let [t, d] =
            Layout::vertical([Constraint::Percentage(45), Constraint::Percentage(55)]).areas(body);
        (t, Some(d))
    };
    Areas {
        header,
        services,
        table,
        detail,
        footer,
    }
}

/// Data rows the table shows (inside its border, under its header row).
pub fn table_rows(app: &App) -> usize {
    let area = Rect::new(0, 0, app.size.0, app.size.1);
    usize::from(areas(area, app).table.height.saturating_sub(3))
}
