//! Watching a node from outside: its metrics fed by a listener of the node
//! and a once-a-second snapshot of its store, served over HTTP (`/metrics`
//! for Prometheus, `/` a read-only status page) from a thread of its own,
//! so a scraper never takes the store thread's time or borrows the store.

mod http;
mod listener;
mod page;
mod snapshot;

use std::net::SocketAddr;
use std::rc::Rc;

use shoal_core::error::Result;

use crate::ops::Ops;

/// Starts counting for `ops`' node and, with an address, serves it there.
/// Returns the address served (the port an address with port 0 got).
pub(crate) fn start(ops: &Rc<Ops>, address: Option<SocketAddr>) -> Result<Option<SocketAddr>> {
    let metrics = ops.node.metrics().clone();
    let nodes = ops
        .cluster
        .as_ref()
        .map_or(1, |c| c.topology().nodes.len() as u32);
    metrics.info.identify(ops.me(), nodes);
    let counted = Rc::new(listener::MetricsListener::default());
    ops.node.listen(counted.clone());
    ops.supervisor
        .spawn_local("metrics snapshot", snapshot::publish(ops.clone(), counted));
    if let Some(c) = &ops.cluster {
        // Members learned later are added as they come (`learning.rs`).
        for node in c.topology().nodes.iter().filter(|n| n.id != c.me) {
            metrics.info.put_peer(node.id, node.metrics);
        }
    }
    address
        .map(|address| http::start(address, metrics, &ops.supervisor))
        .transpose()
}
