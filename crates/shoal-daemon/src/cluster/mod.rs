//! This daemon as one node of a cluster.
//!
//! - ids are unique cluster-wide: a create registers its ids at their home
//!   nodes (`shoal_cluster::home_of`) before allocating; a seal publishes
//!   where they live; a delete, abort or eviction unregisters them.
//! - a get of ids this node does not hold asks their homes (one `Lookup` per
//!   home node, none when the owner is cached), then takes references at the
//!   owners (one `Acquire` per owner node) and answers descriptors (node,
//!   offset, sizes): the client reads the owner's region in place.
//! - references a node takes on another's objects are held there under a
//!   per-node client id, renewed by heartbeats, and dropped when the holder's
//!   heartbeats stop for a lease (a dead node's references are reclaimed) or
//!   its incarnation changes (it restarted). A node keeps the reference a
//!   get took a short while after its clients released it (`loans`), so a
//!   repeated get of the same object asks no one.
//!
//! - a node that (re)starts has its directory rebuilt by its peers before
//!   it registers or looks up ids (`rebuild`).
//!
//! Control travels over the peer RPC (`service`); object bytes never do: in
//! mapped mode they are read in place, in network mode they are pulled over
//! the bulk data channel (`bulk`).

pub(crate) mod bulk;
pub(crate) mod lending;
pub(crate) mod loans;
pub(crate) mod rebuild;
pub(crate) mod service;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::rc::Rc;
use std::time::Duration;

use shoal_cluster::auth::Credentials;
use shoal_cluster::ids::pack;
use shoal_cluster::proto::peer_client::PeerClient;
use shoal_cluster::proto::{
    AcquireReply, AcquireRequest, CachedRequest, HeartbeatReply, HeartbeatRequest, Ids, Location,
    LookupReply, PublishRequest, RegisterRequest, SealRequest, Statuses,
};
use shoal_cluster::{home_of, Access, Directory, Topology};
use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::store::ObjectLocation;
use shoal_core::ObjectId;
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// Which node of which cluster this daemon is.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub topology: Topology,
    pub node: u32,
}

type ClientId = u32;

/// Store client ids at and above this are peer nodes (one per node), never
/// local connections.
pub(crate) const PEER_CLIENT_BASE: ClientId = 0xF000_0000;

pub(crate) fn peer_client(node: u32) -> ClientId {
    PEER_CLIENT_BASE + node
}

/// How long one peer call may take before the peer counts as unavailable.
const RPC_TIMEOUT: Duration = Duration::from_secs(2);

type PeerRpc = PeerClient<InterceptedService<Channel, Credentials>>;

/// An object found on another node: its owner and where it lives there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Remote {
    pub owner: u32,
    /// The owner's incarnation that answered (its region's generation).
    pub generation: u64,
    pub location: ObjectLocation,
    /// The owner's memory cannot be mapped here: pull the bytes (network mode).
    pub network: bool,
}

/// An owner's answer to Acquire.
struct Granted {
    /// The owner's incarnation (its region's generation).
    generation: u64,
    /// Revokes the owner had sent when it answered (`loans`).
    revokes: u64,
    /// Per id, where it is sealed (now referenced by this node), or `None`.
    locations: Vec<Option<ObjectLocation>>,
}

/// The references a node gave up in answer to Revoke or GiveBack.
fn given_up(node: u32, answer: Result<tonic::Response<Ids>>) -> Vec<(u32, ObjectId)> {
    let ids = answer.and_then(|reply| {
        shoal_cluster::ids::unpack(&reply.into_inner().ids)
            .map_err(|s| ShoalError::protocol(format!("node {node}: {}", s.message())))
    });
    match ids {
        Ok(ids) => ids.into_iter().map(|id| (node, id)).collect(),
        Err(err) => {
            tracing::debug!(node, %err, "loans not given back");
            Vec::new()
        }
    }
}

#[derive(Default, Clone, Copy)]
struct PeerSeen {
    last: Option<Instant>,
    incarnation: u64,
}

pub(crate) struct Cluster {
    pub topology: Topology,
    pub me: u32,
    pub incarnation: u64,
    peers: Vec<Option<PeerRpc>>,
    directory: RefCell<Directory>,
    /// Owner of ids seen on other nodes (a cache: a stale entry costs one
    /// failed Acquire, then the home is asked again). Bounded, see
    /// [`remember_owner`].
    owners: RefCell<OwnerCache>,
    /// References this node's clients hold on other nodes' objects, and the
    /// loans among them.
    loans: RefCell<loans::Loans>,
    /// Revokes this node sent as an owner (`loans`: numbers them).
    revokes_sent: Cell<u64>,
    /// Objects local clients are writing in other nodes' regions (remote
    /// allocation), not sealed yet: client → id → node.
    creations: RefCell<HashMap<ClientId, HashMap<ObjectId, u32>>>,
    /// Ids of network-mode copies this node keeps of other nodes' objects.
    copies: RefCell<std::collections::HashSet<ObjectId>>,
    /// The store thread's queue of peer calls, for calls to ourselves (a
    /// home dropping its own node's copies).
    pub(crate) local_calls: std::cell::OnceCell<tokio::sync::mpsc::Sender<service::PeerCall>>,
    /// Heartbeats heard from each peer (leases on what they hold here).
    seen: RefCell<Vec<PeerSeen>>,
    /// Whether each peer answered our last heartbeat; `None` until it first
    /// answers (a peer that is still starting is called, not skipped).
    alive: RefCell<Vec<Option<bool>>>,
    /// When each peer last answered a heartbeat: it had heard from us, so
    /// our lease there (and every reference we hold there) ran at least
    /// until then plus a lease.
    answered: RefCell<Vec<Option<Instant>>>,
    /// Ids freed here whose home did not answer the unregister (down, or cut
    /// off): it still refuses them to every creator, so it is told again
    /// when it answers a heartbeat. home → ids.
    unregister_later: RefCell<HashMap<u32, std::collections::HashSet<ObjectId>>>,
    pub heartbeats_sent: Cell<u64>,
    /// This node's directory rebuild, and what it restores at restarted peers.
    rebuild: RefCell<rebuild::Rebuild>,
}

fn status_error(node: u32, status: tonic::Status) -> ShoalError {
    let kind = match status.code() {
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => ErrorKind::Protocol,
        tonic::Code::InvalidArgument => ErrorKind::InvalidArgument,
        _ => ErrorKind::NodeUnavailable,
    };
    ShoalError::new(kind, format!("node {node}: {}", status.message()))
}

fn to_proto(l: &ObjectLocation) -> Location {
    Location {
        offset: l.offset,
        data_size: l.data_size,
        meta_size: l.meta_size,
    }
}

impl Cluster {
    pub fn new(config: &ClusterConfig) -> Result<Self> {
        let topology = config.topology.clone().sorted();
        topology.node(config.node)?;
        let credentials = Credentials::new(&topology.token, config.node)?;
        let mut peers = Vec::with_capacity(topology.len());
        for node in &topology.nodes {
            if node.id == config.node {
                peers.push(None);
                continue;
            }
            let endpoint = Endpoint::from_shared(format!("http://{}", node.rpc))
                .map_err(|e| ShoalError::invalid(format!("node {}: {e}", node.id)))?
                .connect_timeout(RPC_TIMEOUT)
                .timeout(RPC_TIMEOUT)
                .tcp_nodelay(true)
                // A connection whose peer stops answering (a partition) is
                // dropped after half a lease without a ping answer, so the
                // channel reconnects as soon as the peer is reachable again
                // instead of waiting out TCP's retransmission backoff.
                .http2_keep_alive_interval(topology.lease / 4)
                .keep_alive_timeout(topology.lease / 2)
                .keep_alive_while_idle(true);
            let channel = endpoint.connect_lazy();
            peers.push(Some(
                PeerClient::with_interceptor(channel, credentials.clone())
                    .max_decoding_message_size(64 << 20)
                    .max_encoding_message_size(64 << 20),
            ));
        }
        let incarnation = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let n = topology.len();
        let linger = topology.linger;
        let rebuild = rebuild::Rebuild::new(n, config.node, topology.lease);
        Ok(Self {
            topology,
            me: config.node,
            incarnation,
            peers,
            directory: RefCell::default(),
            owners: RefCell::default(),
            loans: RefCell::new(loans::Loans::new(linger)),
            revokes_sent: Cell::new(0),
            creations: RefCell::default(),
            copies: RefCell::default(),
            local_calls: std::cell::OnceCell::new(),
            seen: RefCell::new(vec![PeerSeen::default(); n]),
            alive: RefCell::new(vec![None; n]),
            answered: RefCell::new(vec![None; n]),
            unregister_later: RefCell::default(),
            heartbeats_sent: Cell::new(0),
            rebuild: RefCell::new(rebuild),
        })
    }

    fn peer(&self, node: u32) -> Result<PeerRpc> {
        self.peers
            .get(node as usize)
            .and_then(Clone::clone)
            .ok_or_else(|| ShoalError::invalid(format!("node {node} is not a peer")))
    }

    /// A peer for a call a client waits on. One that answered heartbeats and
    /// then stopped (down, or cut off by a partition) fails at once instead
    /// of after the RPC timeout, until a heartbeat gets through again.
    pub(crate) fn reachable(&self, node: u32) -> Result<PeerRpc> {
        // Not on one failed heartbeat alone: the first call on a connection
        // to a restarted peer fails too. A peer we heard from within half a
        // lease is tried; a cut-off one is silent both ways.
        let heard = self.seen.borrow().get(node as usize).is_some_and(|s| {
            s.last
                .is_some_and(|t| t.elapsed() < self.topology.lease / 2)
        });
        if !heard && self.alive.borrow().get(node as usize) == Some(&Some(false)) {
            return Err(ShoalError::new(
                ErrorKind::NodeUnavailable,
                format!("node {node} is not answering heartbeats"),
            ));
        }
        self.peer(node)
    }

    pub fn home(&self, id: &ObjectId) -> u32 {
        home_of(id, self.topology.len())
    }

    pub fn is_alive(&self, node: u32) -> bool {
        node == self.me || self.alive.borrow().get(node as usize) == Some(&Some(true))
    }

    /// Groups ids (with their positions) by a key node.
    fn by_node(&self, ids: &[ObjectId], key: impl Fn(&ObjectId) -> u32) -> Vec<(u32, Vec<usize>)> {
        let mut groups: HashMap<u32, Vec<usize>> = HashMap::new();
        for (i, id) in ids.iter().enumerate() {
            groups.entry(key(id)).or_default().push(i);
        }
        let mut groups: Vec<_> = groups.into_iter().collect();
        groups.sort_unstable_by_key(|(node, _)| *node);
        groups
    }

    // -- directory, as a home node ---------------------------------------------

    pub fn directory_register(&self, ids: &[ObjectId], owner: u32) -> Statuses {
        let statuses = self.directory.borrow_mut().register(ids, owner);
        Statuses {
            codes: statuses
                .into_iter()
                .map(|s| s.map_or(0, |k| u32::from(k.code())))
                .collect(),
        }
    }

    /// Forgets the ids; returns the copies (node, id) that must be dropped.
    pub fn directory_unregister(&self, ids: &[ObjectId], owner: u32) -> Vec<(u32, ObjectId)> {
        self.directory.borrow_mut().unregister(ids, owner)
    }

    pub fn directory_add_checked_copies(
        &self,
        ids: &[ObjectId],
        owner: u32,
        locations: &[ObjectLocation],
        node: u32,
    ) -> Vec<bool> {
        self.directory
            .borrow_mut()
            .add_checked_copies(ids, owner, locations, node)
    }

    /// Tells nodes holding network-mode copies of deleted ids to drop them.
    pub async fn send_drops(&self, stale: Vec<(u32, ObjectId)>) {
        let mut by_node: HashMap<u32, Vec<ObjectId>> = HashMap::new();
        for (node, id) in stale {
            by_node.entry(node).or_default().push(id);
        }
        let calls = by_node.into_iter().map(|(node, ids)| async move {
            if node == self.me {
                if let Some(calls) = self.local_calls.get() {
                    let _ = calls.send(service::PeerCall::Drop { ids }).await;
                }
            } else if let Ok(mut peer) = self.peer(node) {
                if let Err(status) = peer.drop(Ids { ids: pack(&ids) }).await {
                    tracing::debug!(node, %status, "drop of copies failed");
                }
            }
        });
        join_all(calls).await;
    }

    /// Ids this node holds as network-mode copies (not owned: never registered).
    pub fn is_copy(&self, id: &ObjectId) -> bool {
        self.copies.borrow().contains(id)
    }

    pub fn forget_copies(&self, ids: &[ObjectId]) -> Vec<ObjectId> {
        let mut copies = self.copies.borrow_mut();
        ids.iter().filter(|id| copies.remove(id)).copied().collect()
    }

    pub fn directory_publish(&self, ids: &[ObjectId], locations: &[ObjectLocation], owner: u32) {
        self.directory.borrow_mut().publish(ids, locations, owner);
    }

    pub fn directory_lookup(&self, ids: &[ObjectId]) -> LookupReply {
        let directory = self.directory.borrow();
        LookupReply {
            entries: ids
                .iter()
                .map(|id| match directory.lookup(id) {
                    Some(e) => shoal_cluster::proto::Entry {
                        known: true,
                        owner: e.owner,
                        sealed: e.sealed.is_some(),
                        location: e.sealed.as_ref().map(to_proto),
                    },
                    None => shoal_cluster::proto::Entry::default(),
                })
                .collect(),
        }
    }

    // -- as an owner: leases of peers' references ---------------------------

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

    /// Peers whose lease ran out since their last heartbeat (their references
    /// here are to be dropped). Each is reported once.
    pub fn expired_leases(&self) -> Vec<u32> {
        let lease = self.topology.lease;
        let mut seen = self.seen.borrow_mut();
        let mut expired = Vec::new();
        for (node, entry) in seen.iter_mut().enumerate() {
            if entry.last.is_some_and(|t| t.elapsed() > lease) {
                entry.last = None;
                expired.push(node as u32);
            }
        }
        expired
    }

    pub fn heartbeat_reply(&self) -> HeartbeatReply {
        HeartbeatReply {
            node: self.me,
            incarnation: self.incarnation,
        }
    }

    /// One round of heartbeats to every peer (concurrently); records who answered.
    /// One heartbeat to `node`, bounded by half a lease (so a peer that
    /// hangs is declared down well before our lease at it runs out); records
    /// whether it answered. Each peer's heartbeats run on their own task, so
    /// a slow peer never delays the others'.
    pub async fn heartbeat(&self, node: u32) {
        let Some(mut peer) = self.peers.get(node as usize).cloned().flatten() else {
            return;
        };
        let request = HeartbeatRequest {
            node: self.me,
            incarnation: self.incarnation,
        };
        let answered = tokio::time::timeout(self.topology.lease / 2, peer.heartbeat(request)).await;
        let ok = matches!(answered, Ok(Ok(_)));
        if ok {
            self.answered.borrow_mut()[node as usize] = Some(Instant::now());
            // Before it counts as alive again (so before any create here can
            // claim those ids there anew).
            self.unregister_missed(node, &mut peer).await;
        }
        let mut alive = self.alive.borrow_mut();
        let was = alive[node as usize];
        if ok && was != Some(true) {
            tracing::info!(node, "peer is up");
        } else if !ok && was == Some(true) {
            tracing::warn!(node, "peer is not answering");
        }
        // A peer that never answered stays unknown (still starting).
        alive[node as usize] = if ok { Some(true) } else { was.map(|_| false) };
        self.heartbeats_sent.set(self.heartbeats_sent.get() + 1);
        self.rebuild.borrow_mut().readiness.heartbeat(node, ok);
    }

    /// Any call from a peer shows it is alive: a node that takes references
    /// here is under a lease from then on, even if its heartbeats have not
    /// reached us yet (or its earlier lease already expired).
    pub fn touch(&self, node: u32) {
        if let Some(entry) = self.seen.borrow_mut().get_mut(node as usize) {
            entry.last = Some(Instant::now());
        }
    }

    // -- as a requester ---------------------------------------------------------

    /// Registers ids for this node at their homes, all or none.
    pub async fn register(&self, ids: &[ObjectId]) -> Result<()> {
        // A starting node claims nothing before its peers heard it started.
        self.until_ready().await;
        let ticket = self.rebuild.borrow_mut().claims.begin();
        let result = self.register_at_homes(ids).await;
        let claimed = if result.is_ok() { ids } else { &[] };
        self.rebuild.borrow_mut().claims.end(ticket, claimed);
        result
    }

    async fn register_at_homes(&self, ids: &[ObjectId]) -> Result<()> {
        let groups = self.by_node(ids, |id| self.home(id));
        let calls = groups.iter().map(|(home, positions)| {
            let group: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
            async move {
                let codes = if *home == self.me {
                    self.directory_register(&group, self.me).codes
                } else {
                    let mut peer = self.reachable(*home)?;
                    peer.register(RegisterRequest {
                        ids: pack(&group),
                        owner: self.me,
                        incarnation: self.incarnation,
                    })
                    .await
                    .map_err(|s| status_error(*home, s))?
                    .into_inner()
                    .codes
                };
                Ok::<_, ShoalError>((*home, group, codes))
            }
        });
        let results = join_all(calls).await;
        let mut failure = None;
        let mut registered = Vec::new();
        for result in results {
            match result {
                Ok((home, group, codes)) => {
                    if let Some(pos) = codes.iter().position(|&c| c != 0) {
                        let kind = ErrorKind::from_code(codes[pos] as u16)
                            .unwrap_or(ErrorKind::ObjectExists);
                        let message = if kind == ErrorKind::NodeUnavailable {
                            format!("node {home} is rebuilding its directory after a restart")
                        } else {
                            format!("object {} already exists in the cluster", group[pos])
                        };
                        failure.get_or_insert(ShoalError::new(kind, message));
                    } else {
                        // Claimed anew: an unregister it missed must not free them.
                        if let Some(missed) = self.unregister_later.borrow_mut().get_mut(&home) {
                            for id in &group {
                                missed.remove(id);
                            }
                        }
                        registered.extend(group.into_iter().map(|id| (home, id)));
                    }
                }
                Err(err) => {
                    failure.get_or_insert(err);
                }
            }
        }
        match failure {
            None => Ok(()),
            Some(err) => {
                let ids: Vec<_> = registered.into_iter().map(|(_, id)| id).collect();
                self.unregister(&ids).await;
                Err(err)
            }
        }
    }

    /// Unregisters ids this node no longer holds (best effort: a home that
    /// is down keeps a stale entry, which gets answer "not found" at the owner).
    pub async fn unregister(&self, ids: &[ObjectId]) {
        self.rebuild.borrow_mut().claims.settle(ids);
        let groups = self.by_node(ids, |id| self.home(id));
        let calls = groups.into_iter().map(|(home, positions)| {
            let group: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
            async move {
                if home == self.me {
                    let stale = self.directory_unregister(&group, self.me);
                    self.send_drops(stale).await;
                } else {
                    let outcome = match self.reachable(home) {
                        Ok(mut peer) => peer
                            .unregister(Ids { ids: pack(&group) })
                            .await
                            .map_err(|s| status_error(home, s)),
                        Err(err) => Err(err),
                    };
                    if let Err(err) = outcome {
                        tracing::debug!(home, %err, "unregister failed; sent again when the home answers");
                        let mut later = self.unregister_later.borrow_mut();
                        later.entry(home).or_default().extend(group);
                    }
                }
            }
        });
        join_all(calls).await;
    }

    /// Sends `home` the unregisters it missed (kept for the next heartbeat
    /// if it fails again).
    async fn unregister_missed(&self, home: u32, peer: &mut PeerRpc) {
        let Some(ids) = self.unregister_later.borrow_mut().remove(&home) else {
            return;
        };
        let ids: Vec<ObjectId> = ids.into_iter().collect();
        match peer.unregister(Ids { ids: pack(&ids) }).await {
            Ok(_) => tracing::info!(
                home,
                ids = ids.len(),
                "unregistered ids freed while the home was unreachable"
            ),
            Err(status) => {
                tracing::debug!(home, %status, "unregister failed again");
                let mut later = self.unregister_later.borrow_mut();
                later.entry(home).or_default().extend(ids);
            }
        }
    }

    /// Tells the homes where sealed ids live; done when every home has it.
    pub async fn publish(&self, ids: &[ObjectId], locations: &[ObjectLocation]) -> Result<()> {
        self.rebuild.borrow_mut().claims.settle(ids);
        let groups = self.by_node(ids, |id| self.home(id));
        let calls = groups.into_iter().map(|(home, positions)| {
            let group: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
            let locs: Vec<ObjectLocation> = positions.iter().map(|&i| locations[i]).collect();
            async move {
                if home == self.me {
                    self.directory_publish(&group, &locs, self.me);
                    return Ok(());
                }
                let mut peer = self.peer(home)?;
                peer.publish(PublishRequest {
                    ids: pack(&group),
                    locations: locs.iter().map(to_proto).collect(),
                })
                .await
                .map(|_| ())
                .map_err(|s| status_error(home, s))
            }
        });
        join_all(calls).await.into_iter().collect()
    }

    /// Finds ids on other nodes and takes a reference on each for `client`.
    /// Ids this node has on loan are served from the loan; the rest cost one
    /// Lookup per home (for ids whose owner is not cached) and one Acquire
    /// per owner. `None` for ids not sealed anywhere (yet).
    pub async fn get(&self, client: ClientId, ids: &[ObjectId]) -> Result<Vec<Option<Remote>>> {
        // A starting node takes no references before its peers heard it
        // started (they drop the references of its previous incarnation).
        self.until_ready().await;
        let mut found = self.borrow_loans(client, ids);
        let mut owners: Vec<Option<u32>> = {
            let cache = self.owners.borrow();
            ids.iter()
                .zip(&found)
                .map(|(id, f)| f.is_none().then(|| cache.get(id).copied()).flatten())
                .collect()
        };
        for attempt in 0..2 {
            let unknown: Vec<usize> = (0..ids.len())
                .filter(|&i| owners[i].is_none() && found[i].is_none())
                .collect();
            if !unknown.is_empty() {
                let wanted: Vec<ObjectId> = unknown.iter().map(|&i| ids[i]).collect();
                let (lookups, homes_down) = self.lookup(&wanted).await?;
                for (&i, owner) in unknown.iter().zip(lookups) {
                    owners[i] = owner.filter(|&o| o != self.me);
                }
                if !homes_down.is_empty() {
                    // Their home is down, but the owner may be alive: ask
                    // every live peer (only the owner has it).
                    let orphans: Vec<usize> = homes_down.iter().map(|&k| unknown[k]).collect();
                    self.search_live_peers(client, ids, &orphans, &mut found)
                        .await;
                }
            }
            let wanted: Vec<usize> = (0..ids.len())
                .filter(|&i| found[i].is_none() && owners[i].is_some())
                .collect();
            if wanted.is_empty() {
                break;
            }
            let mut groups: HashMap<u32, Vec<usize>> = HashMap::new();
            for &i in &wanted {
                groups
                    .entry(owners[i].expect("wanted"))
                    .or_default()
                    .push(i);
            }
            let calls = groups.into_iter().map(|(owner, slots)| {
                let group: Vec<ObjectId> = slots.iter().map(|&i| ids[i]).collect();
                async move {
                    let reply = self.acquire(owner, &group).await;
                    (owner, slots, group, reply)
                }
            });
            let mut stale = false;
            for (owner, slots, group, reply) in join_all(calls).await {
                // An owner that is down: its objects stay missing, the rest are found.
                let granted = match reply {
                    Ok(granted) => granted,
                    Err(err) if err.kind() == ErrorKind::NodeUnavailable => {
                        tracing::debug!(%err, "acquire");
                        for &slot in &slots {
                            owners[slot] = None;
                        }
                        continue;
                    }
                    Err(err) => return Err(err),
                };
                // A descriptor outside the owner's region is refused before
                // anything uses it; the references the reply took go back.
                if let Some(bad) = granted
                    .locations
                    .iter()
                    .flatten()
                    .find(|l| self.check_location(owner, l).is_err())
                {
                    let taken: Vec<(u32, ObjectId)> = group
                        .iter()
                        .zip(&granted.locations)
                        .filter(|(_, l)| l.is_some())
                        .map(|(id, _)| (owner, *id))
                        .collect();
                    self.release(taken).await;
                    return Err(ShoalError::protocol(format!(
                        "node {owner} sent a descriptor outside its region: {bad:?}"
                    )));
                }
                let network = self.is_network(owner);
                let mut cache = self.owners.borrow_mut();
                let mut loans = self.loans.borrow_mut();
                for (k, (&slot, id)) in slots.iter().zip(&group).enumerate() {
                    match granted.locations.get(k).copied().flatten() {
                        Some(location) => {
                            found[slot] = Some(Remote {
                                owner,
                                generation: granted.generation,
                                location,
                                network,
                            });
                            remember_owner(&mut cache, *id, owner);
                            let grant = loans::Grant {
                                owner,
                                generation: granted.generation,
                                location,
                                revokes: granted.revokes,
                            };
                            loans.acquired(client, *id, grant, !network);
                        }
                        None => {
                            // Deleted there, or not sealed yet: ask the home again.
                            cache.remove(id);
                            owners[slot] = None;
                            stale = true;
                        }
                    }
                }
            }
            if !stale || attempt == 1 {
                break;
            }
        }
        Ok(found)
    }

    /// Ids served from this node's loans (one more user each): only loans
    /// of owners not known to be down (a missed heartbeat), at the
    /// incarnation that lent them.
    fn borrow_loans(&self, client: ClientId, ids: &[ObjectId]) -> Vec<Option<Remote>> {
        let mut loans = self.loans.borrow_mut();
        if loans.len() == 0 {
            return vec![None; ids.len()];
        }
        let seen = self.seen.borrow();
        let usable = |loan: &loans::Loan| {
            self.alive.borrow().get(loan.owner as usize) != Some(&Some(false))
                && seen
                    .get(loan.owner as usize)
                    .is_some_and(|s| s.incarnation == 0 || s.incarnation == loan.generation)
        };
        loans
            .borrow(client, ids, usable)
            .into_iter()
            .map(|loan| {
                loan.map(|loan| Remote {
                    owner: loan.owner,
                    generation: loan.generation,
                    location: loan.location,
                    network: false,
                })
            })
            .collect()
    }

    /// Takes references on ids whose home is down by asking every live peer.
    async fn search_live_peers(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        slots: &[usize],
        found: &mut [Option<Remote>],
    ) {
        let wanted: Vec<ObjectId> = slots.iter().map(|&i| ids[i]).collect();
        let live: Vec<u32> = (0..self.topology.len() as u32)
            .filter(|&n| n != self.me && self.is_alive(n))
            .collect();
        let calls = live.into_iter().map(|node| {
            let wanted = &wanted;
            async move { (node, self.acquire(node, wanted).await) }
        });
        let mut surplus = Vec::new();
        for (node, reply) in join_all(calls).await {
            let Ok(granted) = reply else {
                continue;
            };
            let (generation, network) = (granted.generation, self.is_network(node));
            for (k, location) in granted.locations.into_iter().enumerate() {
                let Some(location) = location else { continue };
                if found[slots[k]].is_some() || self.check_location(node, &location).is_err() {
                    // Another node also had it (a network copy): give its reference back.
                    surplus.push((node, wanted[k]));
                    continue;
                }
                found[slots[k]] = Some(Remote {
                    owner: node,
                    generation,
                    location,
                    network,
                });
                remember_owner(&mut self.owners.borrow_mut(), wanted[k], node);
                let grant = loans::Grant {
                    owner: node,
                    generation,
                    location,
                    revokes: granted.revokes,
                };
                self.loans
                    .borrow_mut()
                    .acquired(client, wanted[k], grant, !network);
            }
        }
        if !surplus.is_empty() {
            self.release(surplus).await;
        }
    }

    /// Owner of each id per its home (`None` where unknown or not sealed),
    /// and the positions of ids whose home did not answer.
    async fn lookup(&self, ids: &[ObjectId]) -> Result<(Vec<Option<u32>>, Vec<usize>)> {
        let groups = self.by_node(ids, |id| self.home(id));
        let mut owners = vec![None; ids.len()];
        let mut homes_down = Vec::new();
        let calls = groups.into_iter().map(|(home, positions)| {
            let group: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
            async move {
                let reply = if home == self.me {
                    self.local_lookup(&group)
                } else {
                    match self.reachable(home) {
                        Ok(mut peer) => peer
                            .lookup(Ids { ids: pack(&group) })
                            .await
                            .map(tonic::Response::into_inner)
                            .map_err(|s| status_error(home, s)),
                        Err(e) => Err(e),
                    }
                };
                (positions, reply)
            }
        });
        for (positions, reply) in join_all(calls).await {
            let Ok(reply) = reply else {
                tracing::debug!("lookup failed: {:?}", reply.err());
                homes_down.extend(positions);
                continue;
            };
            for (&i, entry) in positions.iter().zip(reply.entries) {
                if entry.known && entry.sealed {
                    owners[i] = Some(entry.owner);
                }
            }
        }
        Ok((owners, homes_down))
    }

    /// References `ids` at `owner`: per id its location if it is sealed there.
    async fn acquire(&self, owner: u32, ids: &[ObjectId]) -> Result<Granted> {
        let mut peer = self.reachable(owner)?;
        let AcquireReply {
            entries,
            incarnation,
            revokes,
        } = peer
            .acquire(AcquireRequest {
                ids: pack(ids),
                incarnation: self.incarnation,
            })
            .await
            .map_err(|s| status_error(owner, s))?
            .into_inner();
        let locations = shoal_cluster::ids::locations(&entries, ids.len())
            .map_err(|s| ShoalError::protocol(format!("node {owner}: {}", s.message())))?;
        // It heard us just now: our lease there runs from here too.
        self.answered.borrow_mut()[owner as usize] = Some(Instant::now());
        Ok(Granted {
            generation: incarnation,
            revokes,
            locations,
        })
    }

    /// A descriptor from a peer must lie inside that peer's region as the
    /// topology declares it, before anyone touches the memory.
    fn check_location(&self, owner: u32, l: &ObjectLocation) -> Result<()> {
        let node = self.topology.node(owner)?;
        if l.offset
            .checked_add(l.size())
            .is_some_and(|end| end <= node.region_size)
        {
            Ok(())
        } else {
            Err(ShoalError::protocol(format!(
                "node {owner} sent a descriptor outside its region: {l:?}"
            )))
        }
    }

    /// Whether `node`'s memory is reached over the network only.
    pub fn is_network(&self, node: u32) -> bool {
        node != self.me
            && self
                .topology
                .node(node)
                .is_ok_and(|n| n.access == Access::Network)
    }

    /// Tells the homes this node keeps copies of `ids` (dropped on delete).
    /// Announces copies of `owner`'s objects (sealed there at `locations`)
    /// to their homes; call it while still holding the references at the
    /// owner. Per id whether the home recorded the copy: one it refused (the
    /// object was deleted or replaced meanwhile) or could not be told of (a
    /// later delete would not drop it) must not be kept.
    pub async fn announce_copies(
        &self,
        ids: &[ObjectId],
        owner: u32,
        locations: &[ObjectLocation],
    ) -> Vec<bool> {
        self.copies.borrow_mut().extend(ids.iter().copied());
        let mut accepted = vec![false; ids.len()];
        let groups = self.by_node(ids, |id| self.home(id));
        let calls = groups.into_iter().map(|(home, positions)| {
            let group: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
            let at: Vec<ObjectLocation> = positions.iter().map(|&i| locations[i]).collect();
            async move {
                let recorded = if home == self.me {
                    self.directory_add_checked_copies(&group, owner, &at, self.me)
                } else {
                    let request = CachedRequest {
                        ids: pack(&group),
                        owner,
                        locations: at.iter().map(to_proto).collect(),
                    };
                    let answered = match self.reachable(home) {
                        Ok(mut peer) => peer
                            .cached(request)
                            .await
                            .map_err(|status| status_error(home, status)),
                        Err(err) => Err(err),
                    };
                    match answered {
                        Ok(reply) => reply.into_inner().codes.iter().map(|&c| c == 0).collect(),
                        Err(err) => {
                            tracing::debug!(%err, "copy announcement failed");
                            vec![false; group.len()]
                        }
                    }
                };
                (positions, recorded)
            }
        });
        for (positions, recorded) in join_all(calls).await {
            for (i, ok) in positions.into_iter().zip(recorded) {
                accepted[i] = ok;
            }
        }
        let refused: Vec<ObjectId> = (0..ids.len())
            .filter(|&i| !accepted[i])
            .map(|i| ids[i])
            .collect();
        self.forget_copies(&refused);
        accepted
    }

    /// Drops one of `client`'s remote references per id; returns the
    /// (owner, id) references to release at the owners now (a loan's
    /// reference stays while it lingers).
    pub fn unhold(&self, client: ClientId, ids: &[ObjectId]) -> Vec<(u32, ObjectId)> {
        self.loans.borrow_mut().release(client, ids)
    }

    /// As [`unhold`](Self::unhold); ids `client` holds no remote reference
    /// to go to `local` (objects of this node).
    pub fn unhold_remote(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        local: impl FnMut(&ObjectId),
    ) -> Vec<(u32, ObjectId)> {
        self.loans.borrow_mut().release_held(client, ids, local)
    }

    /// Every remote reference of a client that disconnected, to release now.
    pub fn drop_client(&self, client: ClientId) -> Vec<(u32, ObjectId)> {
        self.loans.borrow_mut().drop_client(client)
    }

    /// Loans this node holds (in use or lingering), for `cluster status`.
    pub fn loans_held(&self) -> usize {
        self.loans.borrow().len()
    }

    /// Forgets the loans on owners that have not answered a heartbeat for
    /// three quarters of a lease: our lease there may run out before we
    /// hear from them again (`Loans::owner_lost`). Every heartbeat tick.
    pub fn forget_loans_of_silent_owners(&self) {
        let mut loans = self.loans.borrow_mut();
        if loans.len() == 0 {
            return;
        }
        let limit = self.topology.lease * 3 / 4;
        for (node, answered) in self.answered.borrow().iter().enumerate() {
            if answered.is_some_and(|t| t.elapsed() > limit) {
                let lost = loans.owner_lost(node as u32);
                if lost > 0 {
                    tracing::warn!(
                        node,
                        lost,
                        "forgot the loans on a node that stopped answering"
                    );
                }
            }
        }
    }

    /// Loans idle past the linger, to release now (every heartbeat tick).
    pub fn expired_loans(&self) -> Vec<(u32, ObjectId)> {
        self.loans.borrow_mut().expired()
    }

    /// As a holder: the owner `from` deleted `ids` (its revoke `number`);
    /// returns the ids whose idle loans were given up.
    pub fn revoked(&self, from: u32, number: u64, ids: &[ObjectId]) -> Vec<ObjectId> {
        self.loans.borrow_mut().revoke(from, number, ids)
    }

    /// As a holder: the owner `from` is short of space.
    pub fn give_back_idle(&self, from: u32) -> Vec<ObjectId> {
        self.loans.borrow_mut().give_back_idle(from)
    }

    /// How many Revoke calls this node sent (in Acquire answers: `loans`).
    pub fn revokes_sent(&self) -> u64 {
        self.revokes_sent.get()
    }

    /// As an owner, before answering a delete: tells each node holding
    /// references on deleted ids (node → ids) to stop lending them. Returns
    /// the references they gave up (node, id), which the caller drops. A
    /// node that does not answer keeps lending until its lease here runs
    /// out (docs/cluster.md, "Loans").
    pub async fn revoke(&self, holders: Vec<(u32, Vec<ObjectId>)>) -> Vec<(u32, ObjectId)> {
        if holders.is_empty() {
            return Vec::new();
        }
        let number = self.revokes_sent.get() + 1;
        self.revokes_sent.set(number);
        let calls = holders.into_iter().map(|(node, ids)| async move {
            let request = shoal_cluster::proto::RevokeRequest {
                ids: pack(&ids),
                number,
            };
            let answer = match self.reachable(node) {
                Ok(mut peer) => peer
                    .revoke(request)
                    .await
                    .map_err(|s| status_error(node, s)),
                Err(err) => Err(err),
            };
            given_up(node, answer)
        });
        join_all(calls).await.into_iter().flatten().collect()
    }

    /// As an owner short of space: asks `nodes` to give up their idle loans.
    /// Returns the references they gave up (node, id), which the caller drops.
    pub async fn take_back_idle(&self, nodes: Vec<u32>) -> Vec<(u32, ObjectId)> {
        let calls = nodes.into_iter().map(|node| async move {
            let answer = match self.reachable(node) {
                Ok(mut peer) => peer
                    .give_back(shoal_cluster::proto::Empty {})
                    .await
                    .map_err(|s| status_error(node, s)),
                Err(err) => Err(err),
            };
            given_up(node, answer)
        });
        join_all(calls).await.into_iter().flatten().collect()
    }

    /// Sends releases to owners (one call per owner).
    pub async fn release(&self, refs: Vec<(u32, ObjectId)>) {
        let mut by_owner: HashMap<u32, Vec<ObjectId>> = HashMap::new();
        for (owner, id) in refs {
            by_owner.entry(owner).or_default().push(id);
        }
        let calls = by_owner.into_iter().map(|(owner, ids)| async move {
            if let Ok(mut peer) = self.peer(owner) {
                if let Err(status) = peer.release(Ids { ids: pack(&ids) }).await {
                    // The owner's lease on our references reclaims them.
                    tracing::debug!(owner, %status, "release failed");
                }
            }
        });
        join_all(calls).await;
    }

    /// Remote allocation: asks `node` to create objects in its region for
    /// `client`, which holds the creator's reference there. Returns the
    /// node's incarnation (its region's generation) and the locations.
    pub async fn allocate(
        &self,
        client: ClientId,
        node: u32,
        specs: &[(ObjectId, u64, u32)],
        timeout_ms: u32,
    ) -> Result<(u64, Vec<ObjectLocation>)> {
        let mut peer = self.reachable(node)?;
        let ids: Vec<ObjectId> = specs.iter().map(|s| s.0).collect();
        let mut request = tonic::Request::new(shoal_cluster::proto::AllocateRequest {
            ids: pack(&ids),
            data_sizes: specs.iter().map(|s| s.1).collect(),
            meta_sizes: specs.iter().map(|s| s.2).collect(),
            timeout_ms,
            incarnation: self.incarnation,
        });
        // The node may wait `timeout_ms` for space: the call may take that long.
        request.set_timeout(RPC_TIMEOUT + Duration::from_millis(u64::from(timeout_ms)));
        let reply = match peer.allocate(request).await {
            Ok(reply) => reply.into_inner(),
            Err(status) => {
                // It may have allocated after all: abort whatever it made.
                let _ = peer.abort(Ids { ids: pack(&ids) }).await;
                return Err(status_error(node, status));
            }
        };
        if reply.code != 0 {
            let kind = ErrorKind::from_code(reply.code as u16).unwrap_or(ErrorKind::Protocol);
            return Err(ShoalError::new(
                kind,
                format!("node {node}: {}", reply.message),
            ));
        }
        if reply.offsets.len() != specs.len() {
            return Err(ShoalError::protocol(format!(
                "node {node} answered a short allocation"
            )));
        }
        let locations: Vec<ObjectLocation> = reply
            .offsets
            .iter()
            .zip(specs)
            .map(|(&offset, s)| ObjectLocation {
                offset,
                data_size: s.1,
                meta_size: s.2,
            })
            .collect();
        for l in &locations {
            self.check_location(node, l)?;
        }
        let mut creations = self.creations.borrow_mut();
        let mine = creations.entry(client).or_default();
        for id in &ids {
            mine.insert(*id, node);
            // The creator's reference at the node, returned on release.
            self.loans.borrow_mut().direct(client, *id, node);
        }
        Ok((reply.incarnation, locations))
    }

    /// The node on which `client` is writing `id`, if it allocated it remotely.
    pub fn creation(&self, client: ClientId, id: &ObjectId) -> Option<u32> {
        self.creations.borrow().get(&client)?.get(id).copied()
    }

    /// Seals (or aborts) remotely allocated objects at their node.
    pub async fn finish_remote(
        &self,
        client: ClientId,
        ids: &[ObjectId],
        seal: bool,
        release: bool,
    ) -> Result<()> {
        let mut by_node: HashMap<u32, Vec<ObjectId>> = HashMap::new();
        for id in ids {
            if let Some(node) = self.creation(client, id) {
                by_node.entry(node).or_default().push(*id);
            }
        }
        for (node, group) in by_node {
            let mut peer = self.peer(node)?;
            let outcome = if seal {
                peer.seal(SealRequest {
                    ids: pack(&group),
                    release,
                })
                .await
            } else {
                peer.abort(Ids { ids: pack(&group) }).await
            }
            .map_err(|s| status_error(node, s))?
            .into_inner();
            if outcome.code != 0 {
                let kind = ErrorKind::from_code(outcome.code as u16).unwrap_or(ErrorKind::Protocol);
                return Err(ShoalError::new(
                    kind,
                    format!("node {node}: {}", outcome.message),
                ));
            }
            if let Some(mine) = self.creations.borrow_mut().get_mut(&client) {
                for id in &group {
                    mine.remove(id);
                }
            }
            // Seal-and-release and abort drop the creator's reference at the node.
            if release || !seal {
                self.unhold(client, &group);
            }
        }
        Ok(())
    }

    /// A client went: abort what it was still writing on other nodes.
    pub async fn abort_creations_of(&self, client: ClientId) {
        let Some(mine) = self.creations.borrow_mut().remove(&client) else {
            return;
        };
        let mut by_node: HashMap<u32, Vec<ObjectId>> = HashMap::new();
        for (id, node) in mine {
            by_node.entry(node).or_default().push(id);
        }
        for (node, group) in by_node {
            if let Ok(mut peer) = self.peer(node) {
                let _ = peer.abort(Ids { ids: pack(&group) }).await;
            }
        }
    }

    /// Deletes ids owned elsewhere at their owners; per-id error kinds.
    pub async fn delete_remote(&self, ids: &[ObjectId]) -> Vec<Option<ErrorKind>> {
        self.until_ready().await;
        let (mut owners, homes_down) = match self.lookup(ids).await {
            Ok(found) => found,
            Err(e) => return vec![Some(e.kind()); ids.len()],
        };
        let mut results = vec![Some(ErrorKind::ObjectNotFound); ids.len()];
        // A home that does not answer cannot say who owns its ids: the owner
        // cached here is asked, else the delete cannot be done now.
        for &i in &homes_down {
            owners[i] = self.owners.borrow().get(&ids[i]).copied();
            if owners[i].is_none() {
                results[i] = Some(ErrorKind::NodeUnavailable);
            }
        }
        let known: Vec<usize> = (0..ids.len()).filter(|&i| owners[i].is_some()).collect();
        let mut by_owner: HashMap<u32, Vec<usize>> = HashMap::new();
        for i in known {
            by_owner
                .entry(owners[i].expect("known"))
                .or_default()
                .push(i);
        }
        for (owner, positions) in by_owner {
            if owner == self.me {
                continue; // not here any more (the local delete found nothing)
            }
            let group: Vec<ObjectId> = positions.iter().map(|&i| ids[i]).collect();
            let reply = match self.reachable(owner) {
                Ok(mut peer) => peer.delete(Ids { ids: pack(&group) }).await.map_err(drop),
                Err(_) => Err(()),
            };
            match reply {
                Ok(reply) => {
                    for (&i, code) in positions.iter().zip(reply.into_inner().codes) {
                        results[i] = ErrorKind::from_code(code as u16);
                        self.owners.borrow_mut().remove(&ids[i]);
                    }
                }
                Err(_) => {
                    for &i in &positions {
                        results[i] = Some(ErrorKind::NodeUnavailable);
                    }
                }
            }
        }
        results
    }
}

/// Owners cached at most; past it, half of the entries (any half) go. A
/// node reading millions of remote ids would otherwise keep one entry per id
/// until it is deleted; losing an entry costs one home Lookup on its next get.
const OWNER_CACHE_MAX: usize = 1 << 20;

/// Owners of ids seen on other nodes; on every remote get: foldhash.
type OwnerCache = foldhash::HashMap<ObjectId, u32>;

fn remember_owner(cache: &mut OwnerCache, id: ObjectId, owner: u32) {
    if cache.len() >= OWNER_CACHE_MAX && !cache.contains_key(&id) {
        let mut keep = false;
        cache.retain(|_, _| {
            keep = !keep;
            keep
        });
    }
    cache.insert(id, owner);
}

/// Runs futures concurrently on the current task (peer calls to different
/// nodes overlap; the store thread never blocks on one slow peer).
pub(crate) async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    futures_util::future::join_all(futures).await
}

/// Shared handle used by the connection and server modules.
pub(crate) type ClusterRef = Rc<Cluster>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_cache_stays_bounded_and_keeps_the_newest_entry() {
        let mut cache = OwnerCache::default();
        let id = |i: u32| {
            let mut bytes = [0u8; 20];
            bytes[..4].copy_from_slice(&i.to_le_bytes());
            ObjectId(bytes)
        };
        for i in 0..OWNER_CACHE_MAX as u32 {
            remember_owner(&mut cache, id(i), 1);
        }
        assert_eq!(cache.len(), OWNER_CACHE_MAX);
        remember_owner(&mut cache, id(0), 2); // a known id: updated, nothing dropped
        assert_eq!((cache.len(), cache[&id(0)]), (OWNER_CACHE_MAX, 2));
        let newest = id(OWNER_CACHE_MAX as u32);
        remember_owner(&mut cache, newest, 3);
        assert_eq!(cache.len(), OWNER_CACHE_MAX / 2 + 1);
        assert_eq!(cache[&newest], 3);
    }
}
