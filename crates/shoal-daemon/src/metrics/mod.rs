//! What a node counts and measures, in one registry its `/metrics` endpoint
//! encodes (`observe` serves it). The node owns one [`Metrics`]; the
//! operations time themselves into it, a listener counts the node's events,
//! and the store thread publishes a snapshot of the store's figures into
//! its gauges once a second. Other subsystems (tiers, the capacity
//! controller) add their gauges here as fields of their own.
//!
//! Everything in it is atomics or short locks (prometheus-client's types),
//! so the HTTP thread reads it while the store thread writes it, and
//! nobody ever borrows the store to answer a scrape.

pub mod exposition;
mod history;
pub mod scrape;
pub mod top;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

pub use history::{History, Sample};

/// The operations timed per request (the `op` label of
/// `shoal_op_duration_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Get,
    Seal,
    Abort,
    Release,
    Delete,
    Evict,
}

impl Op {
    pub const ALL: [Op; 7] = [
        Op::Create,
        Op::Get,
        Op::Seal,
        Op::Abort,
        Op::Release,
        Op::Delete,
        Op::Evict,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Get => "get",
            Op::Seal => "seal",
            Op::Abort => "abort",
            Op::Release => "release",
            Op::Delete => "delete",
            Op::Evict => "evict",
        }
    }
}

type OpLabel = [(&'static str, &'static str); 1];

/// Latency buckets: 1 µs doubling to ~8 s, covering a local get (µs) to a
/// create waiting for space (seconds).
fn op_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-6, 2.0, 24))
}

/// Gauges of the store, set from the snapshot the store thread publishes.
#[derive(Default)]
pub struct StoreGauges {
    pub capacity_bytes: Gauge,
    pub region_bytes: Gauge,
    pub used_bytes: Gauge,
    pub objects: Gauge,
    pub sealed_objects: Gauge,
    pub referenced_objects: Gauge,
    pub evictable_objects: Gauge,
    pub clients: Gauge,
    pub loans: Gauge,
    /// The epoch of the cluster's view this node acts on, its members, and
    /// 1 while it is in touch with the membership service (always, with a
    /// static file; docs/cluster.md, "Membership").
    pub view_epoch: Gauge,
    pub view_members: Gauge,
    pub membership_in_touch: Gauge,
    /// Objects of nodes removed for good that this node, as their home,
    /// reported lost; objects it serves from backing stores it adopted
    /// (docs/cluster.md, "Adoption").
    pub objects_lost: Gauge,
    pub objects_adopted: Gauge,
    /// Per other node: 1 while this node hears from it, else 0.
    pub peer_up: Family<[(&'static str, String); 1], Gauge>,
    /// Per other node: 1 while what it held here is quarantined (fenced,
    /// not yet confirmed), else 0.
    pub peer_quarantined: Family<[(&'static str, String); 1], Gauge>,
    /// Per other node: this node's reference calls to it whose answers were
    /// lost, waiting to be sent again or undone.
    pub peer_unsettled_calls: Family<[(&'static str, String); 1], Gauge>,
    /// Per other node: ids whose copies it keeps that this node (as their
    /// home) must still tell it to drop; they cannot be created again until.
    pub peer_drops_owed: Family<[(&'static str, String); 1], Gauge>,
}

/// Counters of what the node did, from its events and the store's totals.
#[derive(Default)]
pub struct EventCounters {
    pub sealed: Counter,
    pub sealed_bytes: Counter,
    pub aborted: Counter,
    pub deleted: Counter,
    pub evictions: Counter,
    pub evicted_bytes: Counter,
    /// Gets clients served themselves from the shared index (no request:
    /// not in `shoal_op_duration_seconds`).
    pub fast_gets: Counter,
}

type TierLabel = [(&'static str, String); 1];

/// The tiers below memory: per tier (`tier` = burst, backing) its capacity,
/// use and objects; the drain's queue and totals (from `Tiers::report`).
#[derive(Default)]
pub struct TierGauges {
    pub capacity_bytes: Family<TierLabel, Gauge>,
    pub used_bytes: Family<TierLabel, Gauge>,
    pub objects: Family<TierLabel, Gauge>,
    pub drain_queue: Gauge,
    pub durable_objects: Gauge,
    pub drain_rate: Gauge,
    pub drained_bytes: Counter,
    pub spilled_bytes: Counter,
    pub restores: Counter,
    pub restored_bytes: Counter,
    pub failures: Counter,
}

/// The elastic capacity controller (set at every step; zero while it is off).
#[derive(Default)]
pub struct ControllerGauges {
    pub target_bytes: Gauge,
    pub ratio: Gauge<f64, AtomicU64>,
    pub node_used_bytes: Gauge,
    pub node_total_bytes: Gauge,
    pub step_bytes: Gauge,
    pub pinned_bytes: Gauge,
    pub over_target: Gauge,
    pub stall_ratio: Gauge<f64, AtomicU64>,
    pub steps: Counter,
    pub urgent_steps: Counter,
    pub released_bytes: Counter,
    pub populated_bytes: Counter,
    pub prefetched: Counter,
    pub cpu_seconds: Counter<f64, AtomicU64>,
    pub release_cpu_seconds: Counter<f64, AtomicU64>,
}

impl ControllerGauges {
    fn register(&self, registry: &mut Registry) {
        for (name, help, gauge) in [
            (
                "shoal_capacity_target_bytes",
                "The elastic capacity controller's target u_i for the store",
                &self.target_bytes,
            ),
            (
                "shoal_controller_node_used_bytes",
                "The node's memory in use v_i at the last control step",
                &self.node_used_bytes,
            ),
            (
                "shoal_controller_node_total_bytes",
                "The node's memory M at the last control step",
                &self.node_total_bytes,
            ),
            (
                "shoal_controller_step_bytes",
                "The last control step's change of the target (negative: shrink)",
                &self.step_bytes,
            ),
            (
                "shoal_controller_pinned_bytes",
                "Bytes of objects in use (referenced or unsealed), which no shrink can evict",
                &self.pinned_bytes,
            ),
            (
                "shoal_controller_over_target",
                "1 while objects in use alone exceed the capacity target (creates are refused)",
                &self.over_target,
            ),
        ] {
            registry.register(name, help, gauge.clone());
        }
        registry.register(
            "shoal_controller_ratio",
            "The node's memory utilisation r_i = v_i / M at the last control step",
            self.ratio.clone(),
        );
        registry.register(
            "shoal_controller_stall_ratio",
            "Share of the last control interval some task stalled on memory (PSI)",
            self.stall_ratio.clone(),
        );
        registry.register(
            "shoal_controller_steps",
            "Control steps taken",
            self.steps.clone(),
        );
        registry.register(
            "shoal_controller_urgent_steps",
            "Control steps after which the next came at the urgent interval (a burst met)",
            self.urgent_steps.clone(),
        );
        registry.register(
            "shoal_released_bytes",
            "Bytes of the region's free ranges given back to the kernel",
            self.released_bytes.clone(),
        );
        registry.register(
            "shoal_populated_bytes",
            "Bytes of the region's memory allocated ahead of use, up to the capacity target (again after a shrink)",
            self.populated_bytes.clone(),
        );
        registry.register(
            "shoal_prefetched_objects",
            "Objects a shrink evicted that the controller restored when the store grew again",
            self.prefetched.clone(),
        );
        registry.register(
            "shoal_controller_cpu_seconds",
            "CPU time the capacity controller spent on the daemon's thread",
            self.cpu_seconds.clone(),
        );
        registry.register(
            "shoal_controller_release_cpu_seconds",
            "Of the controller's CPU time, the part spent carrying shrinks out (evictions, hole punching)",
            self.release_cpu_seconds.clone(),
        );
    }
}

type PeerMethod = [(&'static str, String); 2];

/// Calls to other nodes, per peer and method.
pub struct PeerCalls {
    duration: Family<PeerMethod, Histogram, fn() -> Histogram>,
    errors: Family<PeerMethod, Counter>,
    /// Per channel (rpc, data): how its traffic is protected, 1.
    encryption: Family<[(&'static str, String); 2], Gauge>,
    /// Data-channel transfers this node sent, per protection.
    transfers: Family<[(&'static str, String); 1], Counter>,
}

impl PeerCalls {
    /// One call to `peer` took `elapsed` and succeeded or not (a heartbeat
    /// not answered in time is an error: a miss).
    pub fn observe(&self, peer: u32, method: &'static str, elapsed: std::time::Duration, ok: bool) {
        let labels = [("peer", peer.to_string()), ("method", method.to_owned())];
        self.duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
        let errors = self.errors.get_or_create(&labels);
        if !ok {
            errors.inc();
        }
    }

    /// How `channel`'s traffic is protected (`none`, `tls-userspace`).
    pub fn set_encryption(&self, channel: &'static str, mode: &str) {
        self.encryption
            .get_or_create(&[("channel", channel.to_owned()), ("mode", mode.to_owned())])
            .set(1);
    }

    /// One data-channel transfer sent (a pull served, or a push).
    pub fn transfer_sent(&self, encryption: &str) {
        self.transfers
            .get_or_create(&[("encryption", encryption.to_owned())])
            .inc();
    }

    /// The transfers sent so far under `encryption` (for `shoal stat`).
    pub fn transfers_sent(&self, encryption: &str) -> u64 {
        self.transfers
            .get_or_create(&[("encryption", encryption.to_owned())])
            .get()
    }
}

pub struct Metrics {
    registry: Registry,
    pub peer_calls: PeerCalls,
    /// Per operation, a handle on its histogram in the family (clones share
    /// the same counts): a timed op costs no label lookup.
    op_latency: [Histogram; Op::ALL.len()],
    pub store: StoreGauges,
    pub events: EventCounters,
    pub tiers: TierGauges,
    pub controller: ControllerGauges,
    /// Capacity and usage over the last minutes, for the status page.
    pub history: Mutex<History>,
    /// The busiest clients and largest objects (`/top`).
    pub top: top::Top,
    pub info: NodeInfo,
    started: Instant,
}

/// Times one operation; observed when dropped.
pub struct OpTimer<'a> {
    histogram: &'a Histogram,
    started: Instant,
}

impl Drop for OpTimer<'_> {
    fn drop(&mut self) {
        self.histogram.observe(self.started.elapsed().as_secs_f64());
    }
}

/// Which node this is: set once the daemon knows its cluster; and the
/// other nodes it knows, with where they serve their metrics (the status
/// page's cluster table), joined by members learned at run time.
#[derive(Default)]
pub struct NodeInfo {
    node: Family<[(&'static str, String); 1], Gauge>,
    nodes: Gauge,
    id: AtomicU32,
    peers: std::sync::RwLock<Vec<(u32, Option<std::net::SocketAddr>)>>,
}

impl NodeInfo {
    pub fn identify(&self, node: u32, nodes: u32) {
        self.node.clear();
        self.node
            .get_or_create(&[("node", node.to_string())])
            .set(1);
        self.nodes.set(i64::from(nodes));
        self.id.store(node, Ordering::Relaxed);
    }

    /// This node's id (0 for a single store).
    pub fn id(&self) -> u32 {
        self.id.load(Ordering::Relaxed)
    }

    /// Nodes in the cluster (1 for a single store).
    pub fn nodes(&self) -> u32 {
        self.nodes.get().max(1) as u32
    }

    /// The other nodes known now and their metrics addresses, by node id.
    pub fn peers(&self) -> Vec<(u32, Option<std::net::SocketAddr>)> {
        self.peers.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets or adds one other node (a member learned from the membership:
    /// counted in `shoal_cluster_nodes` from then on).
    pub fn put_peer(&self, node: u32, metrics: Option<std::net::SocketAddr>) {
        let mut peers = self.peers.write().unwrap_or_else(|e| e.into_inner());
        match peers.binary_search_by_key(&node, |p| p.0) {
            Ok(at) => peers[at].1 = metrics,
            Err(at) => {
                peers.insert(at, (node, metrics));
                self.nodes.set(peers.len() as i64 + 1);
            }
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let latency = Family::<OpLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            op_histogram as fn() -> Histogram,
        );
        let op_latency = Op::ALL.map(|op| latency.get_or_create_owned(&[("op", op.name())]));
        registry.register(
            "shoal_op_duration_seconds",
            "Time to serve an operation, waits included (per op; its count is the number of operations)",
            latency,
        );
        let store = StoreGauges::default();
        for (name, help, gauge) in [
            ("shoal_capacity_bytes", "Bytes the store may use", &store.capacity_bytes),
            ("shoal_region_bytes", "Length of the shared-memory region", &store.region_bytes),
            ("shoal_used_bytes", "Bytes allocated to objects", &store.used_bytes),
            ("shoal_objects", "Objects in the store (created or sealed)", &store.objects),
            ("shoal_sealed_objects", "Sealed objects in the store", &store.sealed_objects),
            ("shoal_referenced_objects", "Objects some client holds a reference to", &store.referenced_objects),
            ("shoal_evictable_objects", "Objects the eviction policy may evict", &store.evictable_objects),
            ("shoal_clients", "Local clients connected", &store.clients),
            ("shoal_loans", "References this node holds on other nodes' objects after its clients released them", &store.loans),
            ("shoal_view_epoch", "Epoch of the cluster's view this node acts on (0: a static cluster file)", &store.view_epoch),
            ("shoal_view_members", "Members of the cluster's view this node acts on", &store.view_members),
            ("shoal_membership_in_touch", "1 while this node is in touch with the cluster's membership service (always with a static file)", &store.membership_in_touch),
            ("shoal_objects_lost", "Objects of nodes removed from the cluster for good that no member can serve, as their home here reported them (`shoal cluster status --json` lists their ids)", &store.objects_lost),
            ("shoal_objects_adopted", "Objects this node serves from the backing stores of removed nodes it adopted", &store.objects_adopted),
        ] {
            registry.register(name, help, gauge.clone());
        }
        registry.register(
            "shoal_peer_up",
            "Per other node of the cluster: 1 while this node hears from it",
            store.peer_up.clone(),
        );
        registry.register(
            "shoal_peer_quarantined",
            "Per other node: 1 while what it held here is quarantined (fenced after its lease ran out, not yet confirmed)",
            store.peer_quarantined.clone(),
        );
        registry.register(
            "shoal_peer_unsettled_calls",
            "Per other node: reference calls to it whose answers were lost, to be sent again or undone",
            store.peer_unsettled_calls.clone(),
        );
        registry.register(
            "shoal_peer_drops_owed",
            "Per other node: ids of deleted objects whose network copies it keeps and has not been told to drop yet (unreachable); the ids cannot be created again until it is told",
            store.peer_drops_owed.clone(),
        );
        let events = EventCounters::default();
        for (name, help, counter) in [
            ("shoal_sealed", "Objects sealed", &events.sealed),
            (
                "shoal_sealed_bytes",
                "Bytes (data and metadata) of the objects sealed",
                &events.sealed_bytes,
            ),
            (
                "shoal_aborted",
                "Unsealed objects aborted (or whose creator left)",
                &events.aborted,
            ),
            ("shoal_deleted", "Objects deleted", &events.deleted),
            ("shoal_evictions", "Objects evicted", &events.evictions),
            (
                "shoal_evicted_bytes",
                "Bytes evicted",
                &events.evicted_bytes,
            ),
            (
                "shoal_fast_gets",
                "Gets clients served from the shared object index, without a request to the daemon",
                &events.fast_gets,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        let tiers = TierGauges::default();
        for (name, help, family) in [
            (
                "shoal_tier_capacity_bytes",
                "Bytes a tier below memory may hold (per tier)",
                &tiers.capacity_bytes,
            ),
            (
                "shoal_tier_used_bytes",
                "Bytes a tier below memory holds (per tier)",
                &tiers.used_bytes,
            ),
            (
                "shoal_tier_objects",
                "Object copies on a tier below memory (per tier)",
                &tiers.objects,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
        for (name, help, gauge) in [
            (
                "shoal_drain_queue_depth",
                "Drain jobs queued, running or waiting for a queue",
                &tiers.drain_queue,
            ),
            (
                "shoal_durable_objects",
                "Objects with a durable copy below memory",
                &tiers.durable_objects,
            ),
            (
                "shoal_drain_rate_bytes",
                "Bytes per second drained over the last 5 s",
                &tiers.drain_rate,
            ),
        ] {
            registry.register(name, help, gauge.clone());
        }
        for (name, help, counter) in [
            (
                "shoal_drained_bytes",
                "Bytes written down to a tier by the write-behind drain",
                &tiers.drained_bytes,
            ),
            (
                "shoal_spilled_bytes",
                "Bytes of dirty objects written to a tier because they were evicted",
                &tiers.spilled_bytes,
            ),
            (
                "shoal_restores",
                "Objects restored into memory from a tier",
                &tiers.restores,
            ),
            (
                "shoal_restored_bytes",
                "Bytes restored into memory from a tier",
                &tiers.restored_bytes,
            ),
            (
                "shoal_tier_failures",
                "Writes down to a tier that failed (reported or retried)",
                &tiers.failures,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        let controller = ControllerGauges::default();
        controller.register(&mut registry);
        let start_time = Gauge::<f64, AtomicU64>::default();
        start_time.set(unix_now());
        registry.register(
            "shoal_start_time_seconds",
            "When this daemon started, in seconds since the Unix epoch (a change is a restart)",
            start_time,
        );
        let peer_calls = PeerCalls {
            duration: Family::new_with_constructor(op_histogram as fn() -> Histogram),
            errors: Family::default(),
            encryption: Family::default(),
            transfers: Family::default(),
        };
        registry.register(
            "shoal_peer_encryption",
            "How peer traffic is protected, per channel: rpc none or tls1.3, data none or tls-userspace; 1",
            peer_calls.encryption.clone(),
        );
        registry.register(
            "shoal_data_channel_transfers",
            "Data-channel transfers this node sent (pulls served, pushes), per encryption",
            peer_calls.transfers.clone(),
        );
        registry.register(
            "shoal_peer_rpc_duration_seconds",
            "Time of calls to other nodes, per peer and method (every gRPC method this node calls)",
            peer_calls.duration.clone(),
        );
        registry.register(
            "shoal_peer_rpc_errors",
            "Calls to other nodes that failed or timed out, per peer and method (method=heartbeat: heartbeat misses)",
            peer_calls.errors.clone(),
        );
        let info = NodeInfo::default();
        registry.register(
            "shoal_node",
            "This daemon: 1, labelled with its node id",
            info.node.clone(),
        );
        registry.register(
            "shoal_cluster_nodes",
            "Nodes in this daemon's cluster (1 for a single store)",
            info.nodes.clone(),
        );
        Self {
            registry,
            peer_calls,
            op_latency,
            store,
            events,
            tiers,
            controller,
            history: Mutex::default(),
            top: top::Top::default(),
            info,
            started: Instant::now(),
        }
    }

    /// Starts timing `op`: one line at the top of each operation.
    #[inline]
    pub fn time(&self, op: Op) -> OpTimer<'_> {
        OpTimer {
            histogram: &self.op_latency[op as usize],
            started: Instant::now(),
        }
    }

    pub fn uptime_seconds(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The registry in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(16 << 10);
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
