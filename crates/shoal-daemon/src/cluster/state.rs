//! What this node knows as a member of a cluster: its place in the
//! topology, the directory it keeps as a home node, the owners it cached,
//! the loans it holds, its remote creations and copies, and the rebuild.
//! The behaviour lives beside this file, one concern per file.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use shoal_cluster::auth::PeerIdentity;
use shoal_cluster::bulk::Encryption;
use shoal_cluster::epoch::Epoch;
use shoal_cluster::proto::Location;
use shoal_cluster::rebuild::{Claims, Readiness};
use shoal_cluster::tls::TlsMaterial;
use shoal_cluster::{Directory, Topology, View};
use shoal_core::error::{Result, ShoalError};
use shoal_core::ids::ClientId;
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;

use crate::cluster::copy_records::{CopyOf, OwedDrops};
use crate::cluster::departed_records::Departed;
use crate::cluster::fence_epochs::Fences;
use crate::cluster::loans::Loans;
use crate::cluster::peer_tables::PeerReads;
use crate::cluster::peers::PeerSet;
use crate::cluster::ref_journal::RefJournal;
use crate::cluster::ref_ledger::RefLedger;
use crate::cluster::staging::Staging;
use crate::cluster::witness_records::Witness;
use crate::node::Node;
use crate::supervisor::Supervisor;

/// Which node of which cluster this daemon is.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub topology: Topology,
    pub node: u32,
}

/// An object found on another node: its owner and where it lives there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    pub owner: u32,
    /// The owner's incarnation that answered (its region's generation).
    pub generation: u64,
    pub location: ObjectLocation,
    /// The owner's memory cannot be mapped here: pull the bytes (network mode).
    pub network: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Progress {
    Running,
    Done,
    Failed,
}

/// What this node restored at a peer: for which incarnation and view, how far.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Told {
    pub incarnation: u64,
    /// The epoch of the view the restore chose the ids by.
    pub epoch: u64,
    pub progress: Progress,
}

/// The directory rebuild (`rebuild.rs`): this node's, and the ones it
/// takes part in at restarted peers.
pub(crate) struct Rebuild {
    /// This node's own directory: ready to register and look up?
    pub readiness: Readiness,
    /// Registrations in flight or not in the store yet (restored too).
    pub claims: Claims,
    /// Per peer, the incarnation we restore (or restored) at.
    pub told: Vec<Told>,
    /// Copies orphaned by the end of this node's rebuild, to be dropped.
    pub orphans: Vec<(u32, ObjectId)>,
}

impl Rebuild {
    fn new(slots: usize, members: &[u32], me: u32, lease: Duration) -> Self {
        Self {
            readiness: Readiness::new(slots, members, me, lease, std::time::Instant::now()),
            claims: Claims::default(),
            told: vec![
                Told {
                    incarnation: 0,
                    epoch: 0,
                    progress: Progress::Done,
                };
                slots
            ],
            orphans: Vec::new(),
        }
    }
}

/// Owners cached at most; past it, half of the entries (any half) go. A
/// node reading millions of remote ids would otherwise keep one entry per id
/// until it is deleted; losing an entry costs one home Lookup on its next get.
pub(super) const OWNER_CACHE_MAX: usize = 1 << 20;

/// Owners of ids seen on other nodes; on every remote get: foldhash.
pub(super) type OwnerCache = foldhash::HashMap<ObjectId, u32>;

pub(super) fn remember_owner(cache: &mut OwnerCache, id: ObjectId, owner: u32) {
    if cache.len() >= OWNER_CACHE_MAX && !cache.contains_key(&id) {
        let mut keep = false;
        cache.retain(|_, _| {
            keep = !keep;
            keep
        });
    }
    cache.insert(id, owner);
}

pub(super) fn to_proto(l: &ObjectLocation) -> Location {
    Location {
        offset: l.offset,
        data_size: l.data_size,
        meta_size: l.meta_size,
    }
}

pub struct Cluster {
    /// The nodes known here: with a static file every member; with a
    /// membership, the file's and those learned from the members' records
    /// (`learning.rs`). Per-node tables are sized by its `slots()`.
    pub(crate) topology: RefCell<Topology>,
    /// The ids the cluster file lists (its tables win over records).
    pub(crate) in_file: Vec<u32>,
    /// The members' records this node has acted on (learned or refused),
    /// by node id (`learning.rs`).
    #[cfg(feature = "etcd")]
    pub(crate) records_seen: RefCell<HashMap<u32, String>>,
    /// The members now, and so each id's home (`view_change.rs`).
    pub(crate) view: RefCell<View>,
    /// The view's epoch as the peer calls carry and check it, and whether
    /// this node is in touch with its membership service.
    pub(crate) epoch: Epoch,
    /// When each peer last said, in a heartbeat, that it is in touch with
    /// the membership service (`view_change.rs`: a node cut off from it
    /// alone stops acting as a home).
    pub(crate) peers_in_touch: RefCell<Vec<Option<std::time::Instant>>>,
    pub(crate) me: u32,
    pub(crate) incarnation: u64,
    /// The node this daemon serves: the cluster changes its store through it.
    pub(crate) node: Rc<Node>,
    pub(crate) supervisor: Supervisor,
    /// Who this node is to its peers, and how it checks who they are.
    pub(crate) identity: PeerIdentity,
    /// Its TLS certificate and the CA it trusts; `None`: cleartext peers.
    pub(crate) tls: Option<Arc<TlsMaterial>>,
    pub(crate) peers: PeerSet,
    pub(crate) directory: RefCell<Directory>,
    /// Owner of ids seen on other nodes (a cache: a stale entry costs one
    /// failed Acquire, then the home is asked again). Bounded, see
    /// [`remember_owner`].
    pub(crate) owners: RefCell<OwnerCache>,
    /// References this node's clients hold on other nodes' objects, and the
    /// loans among them.
    pub(crate) loans: RefCell<Loans>,
    /// Revokes this node sent as an owner (`loans`: numbers them).
    pub(crate) revokes_sent: Cell<u64>,
    /// Objects local clients are writing in other nodes' regions (remote
    /// allocation), not sealed yet: client → id → node.
    pub(crate) creations: RefCell<HashMap<ClientId, HashMap<ObjectId, u32>>>,
    /// Staging buffers of those on nodes reached over the network (`staging`).
    pub(crate) staging: RefCell<Staging>,
    /// Network-mode copies this node keeps of other nodes' objects, with
    /// what each was pulled from.
    pub(crate) copies: RefCell<HashMap<ObjectId, CopyOf>>,
    /// As a home: drops of copies not delivered yet (`copies`).
    pub(crate) owed_drops: RefCell<OwedDrops>,
    /// Ids freed here whose home did not answer the unregister (down, or cut
    /// off): it still refuses them to every creator, so it is told again
    /// when it answers a heartbeat. home → ids.
    pub(crate) unregister_later: RefCell<HashMap<u32, HashSet<ObjectId>>>,
    pub(crate) heartbeats_sent: Cell<u64>,
    /// This node's directory rebuild, and what it restores at restarted peers.
    pub(crate) rebuild: RefCell<Rebuild>,
    /// Fence epochs given to peers and heard from owners (`fencing`).
    pub(crate) fences: RefCell<Fences>,
    /// As an owner: the numbered reference calls each peer had applied.
    pub(crate) ledger: RefCell<RefLedger>,
    /// As a holder: numbers of our reference calls, and what to send again.
    pub(crate) journal: RefCell<RefJournal>,
    /// As a holder: our clients' tables at owners they read without a
    /// round trip (`peer_reads`).
    pub(crate) peer_reads: RefCell<PeerReads>,
    /// As a home: the objects of removed nodes, until their adoption, and
    /// those reported lost (`departed`).
    pub(crate) departed: RefCell<Departed>,
    /// The ids this node is home of itself, kept at their runner-up, and
    /// those others keep here (`witness.rs`).
    pub(crate) witness: RefCell<Witness>,
    /// Every view this node adopts, for whoever acts on membership changes
    /// (the daemon's adoption of removed nodes' backing stores).
    pub(crate) views: tokio::sync::watch::Sender<View>,
}

impl Cluster {
    /// This daemon as node `config.node`, in its `incarnation` (its
    /// region's generation), acting on `view` (a static file's: every node
    /// of the file, epoch 0).
    pub fn new(
        config: &ClusterConfig,
        node: Rc<Node>,
        supervisor: Supervisor,
        incarnation: u64,
        view: View,
    ) -> Result<Self> {
        let topology = config.topology.clone().sorted();
        topology.node(config.node)?;
        if let Some(outside) = view.members().iter().find(|&&m| topology.node(m).is_err()) {
            return Err(ShoalError::invalid(format!(
                "the cluster's view {view} names node {outside}, which the cluster file lacks"
            )));
        }
        let epoch = Epoch::default();
        epoch.raise(view.epoch());
        let identity = PeerIdentity::for_node(&topology, config.node)?.with_epoch(epoch.clone());
        if !identity.per_node() {
            tracing::warn!(
                "the cluster file gives no per-node keys: peers prove only the shared token, \
                 so any member can speak as any node (docs/security.md; `shoal cluster up` makes keys)"
            );
        }
        let tls = TlsMaterial::load(&topology, config.node, identity.clone())?;
        match &tls {
            Some(_) => tracing::info!(
                "peer traffic over TLS 1.3, certificates of the cluster's CA (tls_ca)"
            ),
            None if topology.insecure_cleartext => tracing::warn!(
                "insecure_cleartext = true: peer traffic between hosts travels unencrypted, \
                 readable and alterable by anyone on the path (docs/security.md)"
            ),
            None => {}
        }
        let peers = PeerSet::new(&topology, &identity, tls.clone(), node.metrics().clone())?;
        let slots = topology.slots();
        let rebuild = Rebuild::new(slots, view.members(), config.node, topology.lease);
        let linger = topology.linger;
        let views = tokio::sync::watch::Sender::new(view.clone());
        Ok(Self {
            in_file: topology.ids().collect(),
            #[cfg(feature = "etcd")]
            records_seen: RefCell::default(),
            topology: RefCell::new(topology),
            view: RefCell::new(view),
            epoch,
            peers_in_touch: RefCell::new(vec![None; slots]),
            me: config.node,
            incarnation,
            node,
            supervisor,
            identity,
            tls,
            peers,
            directory: RefCell::default(),
            owners: RefCell::default(),
            loans: RefCell::new(Loans::new(linger)),
            revokes_sent: Cell::new(0),
            creations: RefCell::default(),
            staging: RefCell::default(),
            copies: RefCell::default(),
            owed_drops: RefCell::default(),
            unregister_later: RefCell::default(),
            heartbeats_sent: Cell::new(0),
            rebuild: RefCell::new(rebuild),
            fences: RefCell::new(Fences::new(slots)),
            ledger: RefCell::default(),
            journal: RefCell::default(),
            peer_reads: RefCell::default(),
            departed: RefCell::default(),
            witness: RefCell::default(),
            views,
        })
    }

    /// How this node's data channel protects the bytes it sends to a
    /// puller (the one place that decides it).
    pub(crate) fn data_encryption(&self) -> Encryption {
        match &self.tls {
            None => Encryption::None,
            Some(_) if shoal_cluster::tls::kernel::available() => Encryption::Kernel,
            Some(_) => Encryption::UserSpace,
        }
    }

    /// How traffic with peers is protected, as `ClusterInfo` and `shoal
    /// stat` say it.
    pub fn encryption(&self) -> String {
        match (self.data_encryption(), self.topology().insecure_cleartext) {
            (Encryption::None, true) => "none: insecure_cleartext".to_owned(),
            (Encryption::None, false) => "none (every node on loopback)".to_owned(),
            (data, _) => format!("tls1.3, data channel {}", data.as_str()),
        }
    }

    /// The member that keeps `id`'s directory entry under the current view.
    pub fn home(&self, id: &ObjectId) -> u32 {
        self.view.borrow().home(id)
    }

    pub fn is_alive(&self, node: u32) -> bool {
        self.peers.is_alive(node)
    }

    /// The nodes known here (the file's, and members learned since).
    pub(crate) fn topology(&self) -> std::cell::Ref<'_, Topology> {
        self.topology.borrow()
    }

    /// The other nodes known here, in order.
    pub fn others(&self) -> impl Iterator<Item = u32> {
        let me = self.me;
        let others: Vec<u32> = self.topology().ids().filter(|&n| n != me).collect();
        others.into_iter()
    }

    /// Whether `node`'s memory is reached over the network only (its
    /// access is "network", or "host" and it runs on another host).
    pub fn is_network(&self, node: u32) -> bool {
        node != self.me && !self.topology().maps(self.me, node)
    }

    /// A descriptor from a peer must lie inside that peer's region as the
    /// topology declares it, before anyone touches the memory.
    pub fn check_location(&self, owner: u32, l: &ObjectLocation) -> Result<()> {
        let region_size = self.topology().node(owner)?.region_size;
        if l.offset
            .checked_add(l.size())
            .is_some_and(|end| end <= region_size)
        {
            Ok(())
        } else {
            Err(ShoalError::protocol(format!(
                "node {owner} sent a descriptor outside its region: {l:?}"
            )))
        }
    }
}

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
