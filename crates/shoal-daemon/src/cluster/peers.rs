//! The other nodes as this node calls them: one gRPC client each, what we
//! know of their liveness, and the one choke point every peer call goes
//! through ([`PeerSet::call`]): reachability, the timeout, status → error
//! mapping, the per-peer, per-method latency and error metrics, and the
//! fan-out of ids grouped by node. Per-node credentials hook in here.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use shoal_cluster::auth::{Credentials, PeerIdentity};
use shoal_cluster::epoch::{self, Behind, Epoch};
use shoal_cluster::proto::peer_client::PeerClient;
use shoal_cluster::tls::TlsMaterial;
use shoal_cluster::{Node, Topology};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ObjectId;
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tracing::Instrument;

use crate::metrics::Metrics;

/// How long one peer call may take before the peer counts as unavailable.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(2);

/// The start of the message of a call refused because the views of caller
/// and callee differed (`view_change.rs` asks such calls again).
pub(crate) const VIEW_CHANGED: &str = "the cluster's view changed";

/// How long a node waits for its own view to reach the epoch a peer
/// refused its call with (etcd's watch brings it within milliseconds).
const CATCH_UP: Duration = Duration::from_secs(2);

/// How long a node lets a peer whose view is behind catch up before it
/// asks again.
const CALLEE_CATCH_UP: Duration = Duration::from_millis(10);

pub type PeerRpc = PeerClient<InterceptedService<Channel, Credentials>>;

#[derive(Default, Clone, Copy)]
pub struct PeerSeen {
    /// Last call or heartbeat heard from it (its lease on what it holds here).
    pub last: Option<Instant>,
    pub incarnation: u64,
}

pub struct PeerSet {
    me: u32,
    lease: Duration,
    /// By node id; `None`: this node, or one not known (yet).
    rpcs: RefCell<Vec<Option<PeerRpc>>>,
    /// Heartbeats and calls heard from each peer.
    seen: RefCell<Vec<PeerSeen>>,
    /// Whether each peer answered our last heartbeat; `None` until it first
    /// answers (a peer that is still starting is called, not skipped).
    alive: RefCell<Vec<Option<bool>>>,
    /// When each peer last answered us: it had heard from us, so our lease
    /// there (and every reference we hold there) ran at least until then
    /// plus a lease.
    answered: RefCell<Vec<Option<Instant>>>,
    /// This node's view epoch (what a refused call waits for).
    epoch: Option<Epoch>,
    /// Peer calls go over TLS with this material; `None`: cleartext.
    tls: Option<Arc<TlsMaterial>>,
    metrics: Arc<Metrics>,
}

/// Records one peer call when it ends: answered (ok or not), or abandoned
/// before its answer (a caller's timeout, e.g. a heartbeat's), which counts
/// as an error.
struct TimedCall<'a> {
    metrics: &'a Metrics,
    node: u32,
    method: &'static str,
    started: std::time::Instant,
    ok: Option<bool>,
}

impl Drop for TimedCall<'_> {
    fn drop(&mut self) {
        self.metrics.peer_calls.observe(
            self.node,
            self.method,
            self.started.elapsed(),
            self.ok.unwrap_or(false),
        );
    }
}

/// A peer call's failure as a typed error. `PermissionDenied` comes from a
/// refused TLS handshake only (callers that treat such a peer as out of
/// reach rely on it); a refused credential is a protocol error.
pub fn status_error(node: u32, status: tonic::Status) -> ShoalError {
    if let Some(why) = shoal_cluster::tls::refusal_in(&status) {
        return ShoalError::new(
            ErrorKind::PermissionDenied,
            format!("node {node}: TLS refused: {why}"),
        );
    }
    let kind = match status.code() {
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => ErrorKind::Protocol,
        tonic::Code::InvalidArgument => ErrorKind::InvalidArgument,
        _ => ErrorKind::NodeUnavailable,
    };
    ShoalError::new(kind, format!("node {node}: {}", status.message()))
}

/// Groups ids (by position) by a key node, in node order.
pub fn by_node(ids: &[ObjectId], key: impl Fn(&ObjectId) -> u32) -> Vec<(u32, Vec<usize>)> {
    let mut groups: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, id) in ids.iter().enumerate() {
        groups.entry(key(id)).or_default().push(i);
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_unstable_by_key(|(node, _)| *node);
    groups
}

/// Groups (node, id) pairs by node.
pub fn pairs_by_node(pairs: Vec<(u32, ObjectId)>) -> Vec<(u32, Vec<ObjectId>)> {
    let mut groups: HashMap<u32, Vec<ObjectId>> = HashMap::new();
    for (node, id) in pairs {
        groups.entry(node).or_default().push(id);
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_unstable_by_key(|(node, _)| *node);
    groups
}

/// Runs futures concurrently on the current task (peer calls to different
/// nodes overlap; the store thread never blocks on one slow peer).
pub async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    futures_util::future::join_all(futures).await
}

/// Resolves, at start, every peer address given as a host name, and logs
/// what each stands for (or that it does not resolve yet: not fatal, a host
/// may come up later). The connections resolve the name again each time they
/// connect: tonic's connector looks the name up on every (re)connection of a
/// channel, and each data-channel range resolves its own (`bulk::fetch_range`).
pub async fn resolve_peers(topology: &Topology, me: u32) {
    for node in topology.nodes.iter().filter(|n| n.id != me) {
        for (key, address) in [("rpc", &node.rpc), ("data", &node.data)] {
            if address.ip().is_some() {
                continue;
            }
            let found = tokio::net::lookup_host(address.to_string()).await;
            match found {
                Ok(found) => {
                    let found: Vec<String> = found.map(|a| a.to_string()).collect();
                    tracing::info!(node = node.id, %address, resolved = %found.join(" "), "peer {key} address");
                }
                Err(err) => tracing::warn!(
                    node = node.id, %address, %err,
                    "peer {key} address does not resolve (yet); looked up again at each connection"
                ),
            }
        }
    }
}

/// How [`PeerSet::call`] treats a peer known to be down.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Fail at once (a call a client waits on).
    FailFast,
    /// Try anyway (releases, aborts, heartbeats: the peer may be back).
    Try,
}

impl PeerSet {
    /// A client for every node of `topology` but this one (connected on
    /// first use); nodes learned later are dialed by [`PeerSet::dial`].
    pub fn new(
        topology: &Topology,
        identity: &PeerIdentity,
        tls: Option<Arc<TlsMaterial>>,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let slots = topology.slots();
        let peers = Self {
            me: identity.me(),
            lease: topology.lease,
            rpcs: RefCell::new(vec![None; slots]),
            seen: RefCell::new(vec![PeerSeen::default(); slots]),
            alive: RefCell::new(vec![None; slots]),
            answered: RefCell::new(vec![None; slots]),
            epoch: identity.epoch().cloned(),
            tls,
            metrics,
        };
        for node in &topology.nodes {
            peers.dial(node, identity)?;
        }
        Ok(peers)
    }

    /// A client for `node` (a new one if its addresses changed: a member
    /// learned from the membership, or one back with a new record). What
    /// was heard of the node before stays: its heartbeats say the rest.
    pub fn dial(&self, node: &Node, identity: &PeerIdentity) -> Result<()> {
        if node.id == self.me {
            return Ok(());
        }
        // A host name stays a name: the channel's connector resolves it
        // on every (re)connection.
        let endpoint = Endpoint::from_shared(format!("http://{}", node.rpc))
            .map_err(|e| ShoalError::invalid(format!("node {}: {e}", node.id)))?
            .connect_timeout(RPC_TIMEOUT)
            .timeout(RPC_TIMEOUT)
            .tcp_nodelay(true)
            // A connection whose peer stops answering (a partition) is
            // dropped after half a lease without a ping answer, so the
            // channel reconnects as soon as the peer is reachable again
            // instead of waiting out TCP's retransmission backoff.
            .http2_keep_alive_interval(self.lease / 4)
            .keep_alive_timeout(self.lease / 2)
            .keep_alive_while_idle(true);
        let channel = shoal_cluster::tls::rpc::channel(endpoint, self.tls.as_ref(), node.id);
        let rpc = PeerClient::with_interceptor(channel, identity.credentials(node.id)?)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20);
        let mut rpcs = self.rpcs.borrow_mut();
        let slot = rpcs.get_mut(node.id as usize).ok_or_else(|| {
            ShoalError::invalid(format!("node {} is past the cluster's node slots", node.id))
        })?;
        *slot = Some(rpc);
        Ok(())
    }

    fn rpc(&self, node: u32) -> Result<PeerRpc> {
        match self.rpcs.borrow().get(node as usize) {
            Some(Some(rpc)) => Ok(rpc.clone()),
            // A member whose record has not reached this node yet (its
            // join is on its way through the membership's watch).
            Some(None) if node != self.me => Err(ShoalError::new(
                ErrorKind::NodeUnavailable,
                format!("node {node} is not known here yet"),
            )),
            _ => Err(ShoalError::invalid(format!("node {node} is not a peer"))),
        }
    }

    /// A peer for a call a client waits on. One that answered heartbeats and
    /// then stopped (down, or cut off by a partition) fails at once instead
    /// of after the RPC timeout, until a heartbeat gets through again.
    pub fn reachable(&self, node: u32) -> Result<PeerRpc> {
        // Not on one failed heartbeat alone: the first call on a connection
        // to a restarted peer fails too. A peer we heard from within half a
        // lease is tried; a cut-off one is silent both ways.
        let heard = self
            .seen
            .borrow()
            .get(node as usize)
            .is_some_and(|s| s.last.is_some_and(|t| t.elapsed() < self.lease / 2));
        if !heard && self.alive.borrow().get(node as usize) == Some(&Some(false)) {
            return Err(ShoalError::new(
                ErrorKind::NodeUnavailable,
                format!("node {node} is not answering heartbeats"),
            ));
        }
        self.rpc(node)
    }

    /// One call to `node`: `request` gets a client and sends; a refused or
    /// failed call comes back as a typed error naming the node.
    /// `method` names the call in the metrics (`shoal_peer_rpc_*`) and in
    /// its span. A call refused before it is sent (the peer is known down)
    /// is not timed: nothing went over the wire.
    pub async fn call<T, Fut>(
        &self,
        node: u32,
        reach: Reach,
        method: &'static str,
        request: impl FnOnce(PeerRpc) -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let rpc = match reach {
            Reach::FailFast => self.reachable(node)?,
            Reach::Try => self.rpc(node)?,
        };
        let mut timed = TimedCall {
            metrics: &self.metrics,
            node,
            method,
            started: std::time::Instant::now(),
            ok: None,
        };
        let span = tracing::debug_span!("peer_call", peer = node, method);
        let answer = request(rpc).instrument(span).await;
        timed.ok = Some(answer.is_ok());
        match answer {
            Ok(reply) => Ok(reply.into_inner()),
            Err(status) => Err(match epoch::refusal(&status) {
                Some(behind) => self.view_changed(node, behind).await,
                None => status_error(node, status),
            }),
        }
    }

    /// `node` refused a call because our views differ. Returns once asking
    /// again can succeed: this node's view caught up with the peer's, or
    /// (the peer behind) a moment for the peer's to arrive. The error says
    /// so ([`VIEW_CHANGED`]): the caller asks again by its view of then.
    async fn view_changed(&self, node: u32, behind: Behind) -> ShoalError {
        let mine = self.epoch.as_ref().map_or(0, Epoch::get);
        match behind {
            Behind::Caller(theirs) => {
                // Out of touch with the membership service, no newer view
                // comes: waiting would only delay the caller's error.
                let caught_up = match &self.epoch {
                    Some(epoch) if epoch.in_touch() => epoch.reach(theirs, CATCH_UP).await,
                    _ => false,
                };
                if !caught_up {
                    tracing::warn!(
                        node,
                        mine,
                        theirs,
                        "a peer's view is newer and this node's membership did not bring it in time"
                    );
                }
            }
            Behind::Callee(_) => tokio::time::sleep(CALLEE_CATCH_UP).await,
        }
        ShoalError::new(
            ErrorKind::NodeUnavailable,
            format!("{VIEW_CHANGED}: node {node} is at another epoch than this node's {mine} ({behind:?})"),
        )
    }

    // -- liveness ---------------------------------------------------------

    pub fn is_alive(&self, node: u32) -> bool {
        node == self.me || self.alive.borrow().get(node as usize) == Some(&Some(true))
    }

    /// Whether `node` is known down (missed our last heartbeat).
    pub fn known_down(&self, node: u32) -> bool {
        self.alive.borrow().get(node as usize) == Some(&Some(false))
    }

    /// `node` answered a call of ours just now.
    pub fn answered(&self, node: u32) {
        if let Some(slot) = self.answered.borrow_mut().get_mut(node as usize) {
            *slot = Some(Instant::now());
        }
    }

    /// Whether `node` called us or heartbeat us within `within`.
    pub fn heard_within(&self, node: u32, within: Duration) -> bool {
        self.seen
            .borrow()
            .get(node as usize)
            .is_some_and(|s| s.last.is_some_and(|t| t.elapsed() < within))
    }

    /// When each peer last answered us.
    pub fn last_answers(&self) -> Vec<Option<Instant>> {
        self.answered.borrow().clone()
    }

    /// Records our heartbeat's outcome; logs a change of state.
    pub fn heartbeat_answered(&self, node: u32, ok: bool) {
        let mut alive = self.alive.borrow_mut();
        let was = alive[node as usize];
        if ok && was != Some(true) {
            tracing::info!(node, "peer is up");
        } else if !ok && was == Some(true) {
            tracing::warn!(node, "peer is not answering");
        }
        // A peer that never answered stays unknown (still starting).
        alive[node as usize] = if ok { Some(true) } else { was.map(|_| false) };
    }

    /// A peer's heartbeat. Returns whether its references here must be
    /// dropped (it restarted: a new incarnation).
    pub fn heard_from(&self, node: u32, incarnation: u64) -> bool {
        let mut seen = self.seen.borrow_mut();
        let Some(entry) = seen.get_mut(node as usize) else {
            return false;
        };
        let restarted = entry.incarnation != 0 && entry.incarnation != incarnation;
        entry.incarnation = incarnation;
        entry.last = Some(Instant::now());
        if restarted {
            // A new process: whatever our heartbeats saw of the old one (down)
            // says nothing of it, so calls to it are tried again at once.
            self.alive.borrow_mut()[node as usize] = None;
        }
        restarted
    }

    /// Any call from a peer shows it is alive: a node that takes references
    /// here is under a lease from then on, even if its heartbeats have not
    /// reached us yet (or its earlier lease already expired).
    pub fn touch(&self, node: u32) {
        if let Some(entry) = self.seen.borrow_mut().get_mut(node as usize) {
            entry.last = Some(Instant::now());
        }
    }

    /// The incarnation of `node` we last heard (0: none yet).
    pub fn incarnation_of(&self, node: u32) -> Option<u64> {
        self.seen.borrow().get(node as usize).map(|s| s.incarnation)
    }

    /// Peers whose lease ran out since their last heartbeat (their references
    /// here are to be dropped). Each is reported once.
    pub fn expired_leases(&self) -> Vec<u32> {
        let mut seen = self.seen.borrow_mut();
        let mut expired = Vec::new();
        for (node, entry) in seen.iter_mut().enumerate() {
            if entry.last.is_some_and(|t| t.elapsed() > self.lease) {
                entry.last = None;
                expired.push(node as u32);
            }
        }
        expired
    }
}
