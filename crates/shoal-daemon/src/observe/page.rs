//! The status page at `/`: the cluster's nodes with their memory (each
//! read from that node's own `/metrics`), this node's memory, objects and
//! operations, and its capacity and usage over the last minutes as an
//! inline SVG chart. One HTML document built here (no assets, no script, nothing to
//! download): it reloads itself every few seconds and offers no action.

use std::fmt::Write;
use std::net::SocketAddr;

use shoal_core::units::format_size;

use crate::metrics::{exposition, Metrics, Op, Sample};

/// Seconds between reloads of the page.
const REFRESH: u32 = 5;
const CHART_WIDTH: f64 = 640.0;
const CHART_HEIGHT: f64 = 160.0;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}\
table{border-collapse:collapse}td,th{padding:.2em .8em;text-align:right;border-bottom:1px solid #ddd}\
th:first-child,td:first-child{text-align:left}.up{color:#080}.down{color:#b00}\
svg{border:1px solid #ccc;background:#fafafa}.used{fill:#4a8;fill-opacity:.5;stroke:#286}\
.cap{fill:none;stroke:#c33;stroke-dasharray:4 3}";

/// Another node: its id, metrics address, and its samples if it answered.
pub(super) type PeerFigures = (u32, Option<SocketAddr>, Option<Vec<exposition::Sample>>);

pub(super) fn render(metrics: &Metrics, peers: &[PeerFigures]) -> String {
    let store = &metrics.store;
    let node = metrics.info.id();
    let nodes = metrics.info.nodes();
    let capacity = store.capacity_bytes.get().max(0) as u64;
    let used = store.used_bytes.get().max(0) as u64;
    let percent = if capacity > 0 {
        100.0 * used as f64 / capacity as f64
    } else {
        0.0
    };
    let mut page = String::with_capacity(16 << 10);
    let _ = write!(
        page,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{REFRESH}\">\
         <title>shoal node {node}</title><style>{STYLE}</style></head><body>\
         <h1>shoal node {node}</h1><p id=\"cluster\">{}</p>",
        match (nodes > 1, store.view_epoch.get()) {
            (false, _) => "a single store".to_owned(),
            (true, 0) => format!("node {node} of a cluster of {nodes} nodes"),
            (true, epoch) => format!(
                "node {node} of a cluster of {nodes} nodes, {} of them members in view {epoch} \
                 (membership service: {})",
                store.view_members.get(),
                if store.membership_in_touch.get() == 1 {
                    "in touch"
                } else {
                    "out of touch"
                }
            ),
        }
    );
    if nodes > 1 {
        cluster(&mut page, metrics, peers);
    }
    let _ = write!(page, "<h2>Node {node}</h2><table id=\"memory\">");
    for (what, value) in [
        ("capacity", format_size(capacity)),
        ("used", format!("{} ({percent:.1}%)", format_size(used))),
        (
            "region",
            format_size(store.region_bytes.get().max(0) as u64),
        ),
        ("objects", store.objects.get().to_string()),
        ("sealed", store.sealed_objects.get().to_string()),
        ("referenced", store.referenced_objects.get().to_string()),
        ("evictable", store.evictable_objects.get().to_string()),
        ("clients", store.clients.get().to_string()),
        ("loans", store.loans.get().to_string()),
        (
            "evicted",
            format!(
                "{} objects, {}",
                metrics.events.evictions.get(),
                format_size(metrics.events.evicted_bytes.get())
            ),
        ),
        (
            "sealed in all",
            format!(
                "{} objects, {}",
                metrics.events.sealed.get(),
                format_size(metrics.events.sealed_bytes.get())
            ),
        ),
        ("capacity controller", controller(metrics)),
        ("up for", format!("{:.0} s", metrics.uptime_seconds())),
    ] {
        let _ = write!(
            page,
            "<tr><th>{what}</th><td id=\"{}\">{value}</td></tr>",
            what.replace(' ', "-")
        );
    }
    page.push_str("</table>");
    chart(&mut page, metrics);
    operations(&mut page, metrics);
    page.push_str(
        "<p>Read-only. Metrics for Prometheus at <a href=\"/metrics\">/metrics</a>.</p></body></html>",
    );
    page
}

/// The elastic capacity controller in one line ("off" for a static store);
/// the chart's capacity line is what it sets.
fn controller(metrics: &Metrics) -> String {
    let c = &metrics.controller;
    if c.steps.get() == 0 {
        return "off".into();
    }
    let over = if c.over_target.get() != 0 {
        "; objects in use exceed it, creates refused"
    } else {
        ""
    };
    format!(
        "target {}, node memory {} of {} used (r = {:.3}){over}",
        format_size(c.target_bytes.get().max(0) as u64),
        format_size(c.node_used_bytes.get().max(0) as u64),
        format_size(c.node_total_bytes.get().max(0) as u64),
        c.ratio.get()
    )
}

/// Count and mean latency per operation, read back from the exposition.
fn operations(page: &mut String, metrics: &Metrics) {
    let samples = exposition::parse(&metrics.encode());
    let total = |suffix: &str, op: Op| {
        samples
            .iter()
            .find(|s| {
                s.name == format!("shoal_op_duration_seconds_{suffix}")
                    && s.label("op") == Some(op.name())
            })
            .map_or(0.0, |s| s.value)
    };
    page.push_str(
        "<h2>Operations</h2><table id=\"ops\"><tr><th>operation</th><th>served</th><th>mean latency</th></tr>",
    );
    for op in Op::ALL {
        let count = total("count", op);
        let mean = if count > 0.0 {
            format!("{:.1} µs", 1e6 * total("sum", op) / count)
        } else {
            "–".to_owned()
        };
        let _ = write!(
            page,
            "<tr><td>{}</td><td id=\"op-{}\">{count}</td><td>{mean}</td></tr>",
            op.name(),
            op.name()
        );
    }
    page.push_str("</table>");
}

/// Capacity (dashed) and used bytes (filled) over the samples kept.
fn chart(page: &mut String, metrics: &Metrics) {
    let samples: Vec<Sample> = metrics
        .history
        .lock()
        .map(|h| h.samples().copied().collect())
        .unwrap_or_default();
    page.push_str("<h2>Capacity over time</h2>");
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        page.push_str("<p>No samples yet.</p>");
        return;
    };
    let span = (last.at - first.at).max(1.0);
    let top = samples
        .iter()
        .map(|s| s.capacity.max(s.used))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let x = |s: &Sample| (s.at - first.at) / span * CHART_WIDTH;
    let y = |bytes: u64| CHART_HEIGHT - bytes as f64 / top * CHART_HEIGHT;
    let mut used = format!("0,{CHART_HEIGHT} ");
    let mut capacity = String::new();
    for s in &samples {
        let _ = write!(used, "{:.1},{:.1} ", x(s), y(s.used));
        let _ = write!(capacity, "{:.1},{:.1} ", x(s), y(s.capacity));
    }
    let _ = write!(used, "{:.1},{CHART_HEIGHT}", x(last));
    let _ = write!(
        page,
        "<svg id=\"capacity-chart\" width=\"{CHART_WIDTH}\" height=\"{CHART_HEIGHT}\" \
         viewBox=\"0 0 {CHART_WIDTH} {CHART_HEIGHT}\" role=\"img\" aria-label=\"capacity and usage\">\
         <polygon class=\"used\" points=\"{used}\"/><polyline class=\"cap\" points=\"{capacity}\"/></svg>\
         <p>Last {:.0} s: used (filled) up to {}, capacity (dashed) {}; top of the chart {}.</p>",
        span,
        format_size(samples.iter().map(|s| s.used).max().unwrap_or(0)),
        format_size(last.capacity),
        format_size(top as u64)
    );
}

/// One row per node: this one from its own figures, the others from theirs.
fn cluster(page: &mut String, metrics: &Metrics, peers: &[PeerFigures]) {
    let store = &metrics.store;
    let me = metrics.info.id();
    let mut rows = vec![(
        me,
        "up (this node)".to_owned(),
        Some([
            store.capacity_bytes.get() as f64,
            store.used_bytes.get() as f64,
            store.objects.get() as f64,
            store.clients.get() as f64,
        ]),
    )];
    for (node, address, samples) in peers {
        let heard = store
            .peer_up
            .get(&[("peer", node.to_string())])
            .is_some_and(|g| g.get() == 1);
        let figures = samples.as_ref().map(|samples| {
            let value = |name: &str| {
                samples
                    .iter()
                    .find(|s| s.name == name)
                    .map_or(0.0, |s| s.value)
            };
            [
                value("shoal_capacity_bytes"),
                value("shoal_used_bytes"),
                value("shoal_objects"),
                value("shoal_clients"),
            ]
        });
        let state = match (heard, &figures, address) {
            (true, Some(_), _) => "up",
            (true, None, None) => "up (no metrics address)",
            (true, None, Some(_)) => "up (metrics not answering)",
            (false, _, _) => "down",
        };
        rows.push((*node, state.to_owned(), figures));
    }
    rows.sort_by_key(|row| row.0);
    page.push_str(
        "<h2>Cluster</h2><table id=\"cluster-nodes\"><tr><th>node</th><th>state</th>\
         <th>capacity</th><th>used</th><th></th><th>objects</th><th>clients</th></tr>",
    );
    for (node, state, figures) in rows {
        let class = if state.starts_with("up") {
            "up"
        } else {
            "down"
        };
        let _ = write!(
            page,
            "<tr id=\"node-{node}\"><td>{node}</td><td class=\"{class}\">{state}</td>"
        );
        match figures {
            Some([capacity, used, objects, clients]) => {
                let percent = if capacity > 0.0 {
                    100.0 * used / capacity
                } else {
                    0.0
                };
                let _ = write!(
                    page,
                    "<td>{}</td><td>{} ({percent:.1}%)</td>\
                     <td><svg width=\"100\" height=\"10\"><rect width=\"100\" height=\"10\" fill=\"#eee\"/>\
                     <rect width=\"{percent:.1}\" height=\"10\" fill=\"#4a8\"/></svg></td>\
                     <td class=\"objects\">{objects}</td><td>{clients}</td></tr>",
                    format_size(capacity as u64),
                    format_size(used as u64)
                );
            }
            None => page.push_str("<td>–</td><td>–</td><td></td><td>–</td><td>–</td></tr>"),
        }
    }
    page.push_str("</table>");
}
