//! Once a second the store thread copies the store's figures into the
//! metrics' gauges (and the status page's history), and the events counted
//! since into its counters: a scrape reads them there, never the store.

use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::metrics::top::{self, ObjectRow, TopView};
use crate::metrics::{unix_now, Metrics, Sample};
use crate::observe::listener::MetricsListener;
use crate::ops::Ops;

const EVERY: Duration = Duration::from_secs(1);

pub(super) async fn publish(ops: Rc<Ops>, counted: Rc<MetricsListener>) {
    let mut ticker = tokio::time::interval(EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Instant::now();
    loop {
        ticker.tick().await;
        let metrics = ops.node.metrics();
        counted.publish(&metrics.events);
        take(&ops, metrics);
        take_top(&ops, metrics, last.elapsed().as_secs_f64());
        last = Instant::now();
    }
}

/// The busiest clients over the last `seconds`, and while someone reads
/// `/top`, the largest objects.
fn take_top(ops: &Ops, metrics: &Metrics, seconds: f64) {
    let at = unix_now();
    let largest = if metrics.top.wanted((at * 1000.0) as u64) {
        ops.node
            .read(|store| store.largest(top::ROWS))
            .into_iter()
            .map(|o| ObjectRow {
                id: o.id.to_hex(),
                bytes: o.location.data_size + u64::from(o.location.meta_size),
                sealed: o.sealed,
                refs: o.refs,
            })
            .collect()
    } else {
        Vec::new()
    };
    metrics.top.publish(TopView {
        at,
        clients: ops.node.busiest_clients(top::ROWS, seconds),
        largest,
    });
}

fn take(ops: &Ops, metrics: &Metrics) {
    let (stats, fast_gets) = ops.node.read(|store| (store.stats(), store.fast_gets()));
    let gauges = &metrics.store;
    let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    gauges.capacity_bytes.set(signed(stats.capacity));
    gauges.region_bytes.set(signed(stats.region_size));
    gauges.used_bytes.set(signed(stats.used));
    gauges.objects.set(signed(stats.objects));
    gauges.sealed_objects.set(signed(stats.sealed));
    gauges.referenced_objects.set(signed(stats.referenced));
    gauges.evictable_objects.set(signed(stats.evictable));
    gauges.clients.set(signed(ops.node.connected() as u64));
    // The store keeps running totals: the counters move by the difference.
    let events = &metrics.events;
    events
        .evictions
        .inc_by(stats.evictions.saturating_sub(events.evictions.get()));
    events.evicted_bytes.inc_by(
        stats
            .evicted_bytes
            .saturating_sub(events.evicted_bytes.get()),
    );
    events
        .fast_gets
        .inc_by(fast_gets.saturating_sub(events.fast_gets.get()));
    if let Some(cluster) = &ops.cluster {
        gauges.loans.set(signed(cluster.loans_held() as u64));
        let view = cluster.view();
        gauges.view_epoch.set(signed(view.epoch()));
        gauges.view_members.set(signed(view.members().len() as u64));
        gauges
            .membership_in_touch
            .set(i64::from(cluster.membership_in_touch()));
        gauges.objects_lost.set(signed(cluster.lost_count()));
        if let Some(tiers) = &ops.tiers {
            gauges.objects_adopted.set(signed(tiers.adopted_objects()));
        }
        for peer in cluster.others() {
            let label = [("peer", peer.to_string())];
            gauges
                .peer_up
                .get_or_create(&label)
                .set(i64::from(cluster.is_alive(peer)));
            gauges
                .peer_quarantined
                .get_or_create(&label)
                .set(i64::from(cluster.quarantines(peer)));
            gauges
                .peer_unsettled_calls
                .get_or_create(&label)
                .set(signed(cluster.unsettled_calls_to(peer) as u64));
            gauges
                .peer_drops_owed
                .get_or_create(&label)
                .set(signed(cluster.drops_owed_to(peer) as u64));
        }
    }
    if ops.tiers.is_some() {
        let report = ops.tier_report();
        let t = &metrics.tiers;
        for tier in &report.tiers {
            let label = [("tier", tier.level_name().to_string())];
            t.capacity_bytes
                .get_or_create(&label)
                .set(signed(tier.capacity));
            t.used_bytes.get_or_create(&label).set(signed(tier.used));
            t.objects.get_or_create(&label).set(signed(tier.objects));
        }
        t.drain_queue.set(signed(report.queue_depth));
        t.durable_objects.set(signed(report.durable_objects));
        t.drain_rate.set(signed(report.drain_rate));
        for (counter, total) in [
            (&t.drained_bytes, report.drained_bytes),
            (&t.spilled_bytes, report.spilled_bytes),
            (&t.restores, report.restores),
            (&t.restored_bytes, report.restored_bytes),
            (&t.failures, report.failures),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }
    if let Ok(mut history) = metrics.history.lock() {
        history.push(Sample {
            at: unix_now(),
            capacity: stats.capacity,
            used: stats.used,
            objects: stats.objects,
        });
    }
}
