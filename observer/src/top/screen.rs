//! The full-screen view: the table redrawn every refresh and on every
//! resize, keys to sort and to quit, like top. ratatui draws it (and
//! restores the terminal on the way out, a panic included); crossterm,
//! which ratatui re-exports, reads the keys.
use std::time::{Duration, Instant};

use ratatui::{
    DefaultTerminal, Frame,
    crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    style::{Modifier, Style},
    text::Line,
    widgets::Paragraph,
};

use super::{
    reading::{Rates, Reading},
    table::{self, SortBy},
};

/// What the view shows now.
struct View {
    rates: Rates,
    by: SortBy,
    /// The last refresh's failure, shown until one succeeds.
    problem: Option<String>,
    source: String,
}

/// Run the view until q, Esc or Ctrl-C; `read` takes a reading.
pub fn run(
    mut read: impl FnMut() -> Result<Reading, String>,
    by: SortBy,
    interval: Duration,
    source: String,
) -> std::io::Result<()> {
    let mut before = read();
    let mut view = View { rates: Rates::default(), by, problem: before.as_ref().err().cloned(), source };
    let mut terminal = ratatui::init();
    let result = run_loop(&mut terminal, &mut read, &mut before, &mut view, interval);
    ratatui::restore();
    result
}

fn run_loop(
    terminal: &mut DefaultTerminal,
    read: &mut impl FnMut() -> Result<Reading, String>,
    before: &mut Result<Reading, String>,
    view: &mut View,
    interval: Duration,
) -> std::io::Result<()> {
    let mut next = Instant::now() + interval;
    loop {
        terminal.draw(|frame| draw(frame, view))?;
        let wait = next.saturating_duration_since(Instant::now());
        if event::poll(wait)? {
            match event::read()? {
                Event::Key(key) if key.kind == KeyEventKind::Press => match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                    KeyCode::Char(c) => view.by = SortBy::from_key(c).unwrap_or(view.by),
                    _ => {}
                },
                // A resize is redrawn at the new size by the next draw.
                _ => {}
            }
            continue;
        }
        match (read(), before.as_ref()) {
            (Ok(now), Ok(then)) => {
                view.rates = now.rates_since(then);
                view.problem = None;
                *before = Ok(now);
            }
            (Ok(now), Err(_)) => *before = Ok(now),
            (Err(e), _) => view.problem = Some(e),
        }
        next = Instant::now() + interval;
    }
}

fn draw(frame: &mut Frame, view: &View) {
    let area = frame.area();
    // Rows for the processes: what the screen holds after the headers,
    // with a few destinations below.
    let rows = usize::from(area.height).saturating_sub(6);
    let processes = rows.saturating_sub(rows / 3).max(1);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut lines = vec![Line::from(format!(
        "observer top  {}  per second over {:.1} s  sort: e EADDRNOTAVAIL  r errors  t TIME_WAIT  o overflows  c \
         connects  a accepts  q quit",
        view.source, view.rates.seconds
    ))];
    lines.push(match &view.problem {
        Some(p) => Line::styled(format!("cannot read {}: {p}", view.source), bold),
        None => Line::from(""),
    });
    lines.push(Line::styled(table::process_header(view.by), Style::default().add_modifier(Modifier::REVERSED)));
    lines.extend(table::process_lines(&view.rates, view.by, processes).into_iter().map(Line::from));
    lines.push(Line::from(""));
    lines.push(Line::styled(table::destination_header(), Style::default().add_modifier(Modifier::REVERSED)));
    let below = rows - processes.min(rows);
    let destinations = table::destination_lines(&view.rates, below);
    let listeners = table::listener_lines(&view.rates, below.saturating_sub(destinations.len() + 2));
    lines.extend(destinations.into_iter().map(Line::from));
    if !listeners.is_empty() {
        lines.push(Line::from(""));
        lines.push(Line::styled(table::listener_header(), Style::default().add_modifier(Modifier::REVERSED)));
        lines.extend(listeners.into_iter().map(Line::from));
    }
    frame.render_widget(Paragraph::new(lines), area);
}
