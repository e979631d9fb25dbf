//! `shoal top` drawn with ratatui and crossterm (the `top` feature).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Block, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;
use shoal_core::units::format_size;
use shoal_daemon::metrics::exposition::Sample;
use shoal_daemon::metrics::scrape::{fetch, scrape};
use shoal_daemon::metrics::top::{TopView, ROWS};

use super::args::TopArgs;

/// Refreshes a second; usage kept for this many of them (5 minutes).
const REFRESH: Duration = Duration::from_secs(1);
const KEPT: usize = 300;
const SCRAPE_TIMEOUT: Duration = Duration::from_millis(700);

/// One node as last read, and what it did between the last two reads.
struct Watched {
    name: String,
    address: Option<SocketAddr>,
    figures: Option<Figures>,
    previous: Option<(Instant, f64, f64)>,
    /// Its busiest clients and largest objects, as last read.
    top: Option<TopView>,
    ops_per_second: f64,
    sealed_per_second: f64,
    used: VecDeque<u64>,
}

#[derive(Clone, Copy, Default)]
struct Figures {
    capacity: f64,
    used: f64,
    objects: f64,
    clients: f64,
    loans: f64,
    ops: f64,
    sealed_bytes: f64,
}

fn figures(samples: &[Sample]) -> Figures {
    let sum = |name: &str| -> f64 {
        samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    };
    Figures {
        capacity: sum("shoal_capacity_bytes"),
        used: sum("shoal_used_bytes"),
        objects: sum("shoal_objects"),
        clients: sum("shoal_clients"),
        loans: sum("shoal_loans"),
        ops: sum("shoal_op_duration_seconds_count"),
        sealed_bytes: sum("shoal_sealed_bytes_total"),
    }
}

impl Watched {
    fn update(&mut self, samples: Option<Vec<Sample>>, now: Instant) {
        self.figures = samples.as_deref().map(figures);
        let Some(f) = self.figures else {
            self.previous = None;
            return;
        };
        if let Some((then, ops, sealed)) = self.previous {
            let seconds = now.duration_since(then).as_secs_f64().max(1e-3);
            // A restart resets the counters: no negative rates.
            self.ops_per_second = (f.ops - ops).max(0.0) / seconds;
            self.sealed_per_second = (f.sealed_bytes - sealed).max(0.0) / seconds;
        }
        self.previous = Some((now, f.ops, f.sealed_bytes));
        if self.used.len() == KEPT {
            self.used.pop_front();
        }
        self.used.push_back(f.used as u64);
    }
}

/// Draws until `q`, Esc or Ctrl-C.
pub fn run(args: TopArgs) -> Result<()> {
    let (title, mut nodes) = if args.addresses.is_empty() {
        let topology = crate::cluster::load(&crate::cluster::DirArgs {
            dir: args.dir,
            file: args.file,
            json: false,
        })?;
        let nodes: Vec<Watched> = topology
            .nodes
            .iter()
            .map(|n| watched(format!("node {}", n.id), n.metrics))
            .collect();
        if nodes.iter().all(|n| n.address.is_none()) {
            bail!("no node of cluster {:?} serves metrics (cluster up without --no-metrics, or `metrics` in the cluster file)", topology.name);
        }
        (format!("cluster {:?}", topology.name), nodes)
    } else {
        let nodes = args
            .addresses
            .iter()
            .map(|a| watched(a.to_string(), Some(*a)))
            .collect();
        ("daemons".to_owned(), nodes)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut terminal = ratatui::init();
    let result = (|| -> Result<()> {
        loop {
            let now = Instant::now();
            let read = runtime.block_on(futures_util::future::join_all(nodes.iter().map(
                |n| async move {
                    let Some(address) = n.address else {
                        return (None, None);
                    };
                    let (samples, top) = futures_util::future::join(
                        scrape(address, SCRAPE_TIMEOUT),
                        fetch(address, "/top", SCRAPE_TIMEOUT),
                    )
                    .await;
                    let top = top.and_then(|json| TopView::from_json(&json));
                    (samples, top)
                },
            )));
            for (node, (samples, top)) in nodes.iter_mut().zip(read) {
                node.update(samples, now);
                node.top = top;
            }
            terminal.draw(|frame| draw(frame, &title, &nodes))?;
            // Keys until the next refresh is due.
            let due = now + REFRESH;
            while let Some(left) = due.checked_duration_since(Instant::now()) {
                if !event::poll(left)? {
                    break;
                }
                if let Event::Key(key) = event::read()? {
                    let quit = matches!(key.code, KeyCode::Char('q') | KeyCode::Esc)
                        || (key.code == KeyCode::Char('c')
                            && key.modifiers.contains(KeyModifiers::CONTROL));
                    if quit && key.kind == KeyEventKind::Press {
                        return Ok(());
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result
}

fn watched(name: String, address: Option<SocketAddr>) -> Watched {
    Watched {
        name,
        address,
        figures: None,
        previous: None,
        top: None,
        ops_per_second: 0.0,
        sealed_per_second: 0.0,
        used: VecDeque::with_capacity(KEPT),
    }
}

fn draw(frame: &mut Frame, title: &str, nodes: &[Watched]) {
    let up: Vec<&Figures> = nodes.iter().filter_map(|n| n.figures.as_ref()).collect();
    let (capacity, used) = up
        .iter()
        .fold((0.0, 0.0), |(c, u), f| (c + f.capacity, u + f.used));
    let ops: f64 = nodes.iter().map(|n| n.ops_per_second).sum();
    let header = format!(
        "shoal top: {title}, {} of {} nodes answering; used {} of {}; {ops:.0} ops/s   (q quits)",
        up.len(),
        nodes.len(),
        format_size(used as u64),
        format_size(capacity as u64)
    );
    let areas = Layout::vertical(
        [
            Constraint::Length(1),
            Constraint::Length(nodes.len() as u16 + 3),
            Constraint::Length(ROWS as u16 + 3),
        ]
        .into_iter()
        .chain(nodes.iter().map(|_| Constraint::Length(3)))
        .chain([Constraint::Min(0)]),
    )
    .split(frame.area());
    frame.render_widget(
        Paragraph::new(header).style(Style::default().add_modifier(Modifier::BOLD)),
        areas[0],
    );
    let rows = nodes.iter().map(|n| match &n.figures {
        Some(f) => Row::new(vec![
            n.name.clone(),
            "up".into(),
            format_size(f.capacity as u64),
            format_size(f.used as u64),
            format!(
                "{:.1}%",
                if f.capacity > 0.0 {
                    100.0 * f.used / f.capacity
                } else {
                    0.0
                }
            ),
            format!("{:.0}", f.objects),
            format!("{:.0}", f.clients),
            format!("{:.0}", f.loans),
            format!("{:.0}", n.ops_per_second),
            format!("{}/s", format_size(n.sealed_per_second as u64)),
        ]),
        None => {
            Row::new(vec![n.name.clone(), "down".into()]).style(Style::default().fg(Color::Red))
        }
    });
    let widths = [
        Constraint::Length(22),
        Constraint::Length(5),
        Constraint::Length(11),
        Constraint::Length(11),
        Constraint::Length(7),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Length(12),
    ];
    let table = Table::new(rows, widths)
        .header(
            Row::new(vec![
                "NODE", "STATE", "CAPACITY", "USED", "USE", "OBJECTS", "CLIENTS", "LOANS", "OPS/S",
                "SEALED",
            ])
            .style(Style::default().add_modifier(Modifier::BOLD)),
        )
        .block(Block::bordered().title(" nodes "));
    frame.render_widget(table, areas[1]);
    draw_top(frame, areas[2], nodes);
    for (i, n) in nodes.iter().enumerate() {
        let area = areas[3 + i];
        // The newest samples that fit, right-aligned.
        let width = area.width.saturating_sub(2) as usize;
        let data: Vec<u64> = n.used.iter().rev().take(width).rev().copied().collect();
        let max = n
            .figures
            .map_or(1, |f| f.capacity.max(1.0) as u64)
            .max(data.iter().copied().max().unwrap_or(1));
        let sparkline = Sparkline::default()
            .block(Block::bordered().title(format!(" {} used, last {} s ", n.name, data.len())))
            .data(&data)
            .max(max)
            .style(Style::default().fg(Color::Green));
        frame.render_widget(sparkline, area);
    }
}

/// The busiest clients and the largest objects of all nodes, side by side.
fn draw_top(frame: &mut Frame, area: ratatui::layout::Rect, nodes: &[Watched]) {
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut clients: Vec<(&str, &shoal_daemon::metrics::top::ClientRow)> = nodes
        .iter()
        .filter_map(|n| n.top.as_ref().map(|t| (n, t)))
        .flat_map(|(n, t)| t.clients.iter().map(move |c| (n.name.as_str(), c)))
        .collect();
    clients.sort_by(|a, b| {
        b.1.requests_per_second
            .total_cmp(&a.1.requests_per_second)
            .then(b.1.requests.cmp(&a.1.requests))
    });
    let rows = clients.iter().take(ROWS).map(|(node, c)| {
        Row::new(vec![
            node.to_string(),
            c.pid.to_string(),
            format!("{:.0}", c.requests_per_second),
            format!("{:.0}", c.objects_per_second),
            c.requests.to_string(),
            format!("{:.0}s", c.connected_seconds),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(10),
            Constraint::Length(8),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(7),
        ],
    )
    .header(Row::new(vec!["NODE", "PID", "REQ/S", "OBJ/S", "REQUESTS", "UP"]).style(bold))
    .block(Block::bordered().title(" busiest clients "));
    frame.render_widget(table, left);

    let mut objects: Vec<(&str, &shoal_daemon::metrics::top::ObjectRow)> = nodes
        .iter()
        .filter_map(|n| n.top.as_ref().map(|t| (n, t)))
        .flat_map(|(n, t)| t.largest.iter().map(move |o| (n.name.as_str(), o)))
        .collect();
    objects.sort_by_key(|o| std::cmp::Reverse(o.1.bytes));
    let rows = objects.iter().take(ROWS).map(|(node, o)| {
        Row::new(vec![
            node.to_string(),
            o.id.chars().take(16).collect::<String>(),
            format_size(o.bytes),
            if o.sealed { "sealed" } else { "writing" }.to_owned(),
            o.refs.to_string(),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(10),
            Constraint::Length(17),
            Constraint::Length(11),
            Constraint::Length(8),
            Constraint::Length(5),
        ],
    )
    .header(Row::new(vec!["NODE", "ID", "SIZE", "STATE", "REFS"]).style(bold))
    .block(Block::bordered().title(" largest objects "));
    frame.render_widget(table, right);
}
