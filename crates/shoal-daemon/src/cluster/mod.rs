//! This daemon as one node of a cluster.
//!
//! - ids are unique cluster-wide: a create registers its ids at their home
//!   nodes (`shoal_cluster::View::home`) before allocating; a seal publishes
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
//! - with a membership service (etcd), homes follow the members of the
//!   current view; a newer view moves homes and the owners restore the moved
//!   entries at their new homes (`view_change`, `membership`); the objects
//!   of a node removed for good are adopted from its backing store or
//!   reported lost (`departed`, and the daemon's `adoption`).
//!
//! Control travels over the peer RPC (`crate::peer_service`); object bytes never do: in
//! mapped mode they are read (and remotely allocated objects written) in
//! place, in network mode they are pulled, and pushed, over the bulk data
//! channel (`bulk`, `staging`).
//!
//! Layout: `state` (what the node knows), `peers` (calling other nodes),
//! then one file per concern, each an `impl Cluster`: `directory` (as a
//! home), `registry` (claiming and publishing ids), `remote_get`,
//! `holding` and `loans` (as a holder), `peer_reads` (clients reading
//! owners' indexes themselves), `lending` (as an owner),
//! `remote_alloc` (with `push` and `staging`: on nodes reached over the
//! network, the bytes written here and pushed at the seal), `copies`, `leases`, `fencing` (a peer cut off past its
//! lease), `ref_ledger` / `ref_journal` (numbered Acquire and Release calls,
//! applied once and sent again until answered), `rebuild`, `view_change`, `bulk`, `names` (the
//! namespace as the union of the nodes' names); `listener` is how
//! the cluster hears its node.

mod bulk;
mod copies;
mod copy_records;
mod departed;
mod departed_records;
mod directory;
mod fence_epochs;
mod fencing;
mod holding;
mod learning;
mod leases;
mod lending;
mod listener;
mod loans;
pub mod membership;
pub mod names;
mod peer_reads;
mod peer_tables;
pub mod peers;
mod push;
mod rebuild;
mod ref_journal;
mod ref_ledger;
mod registry;
mod remote_alloc;
mod remote_get;
mod staging;
mod state;
mod view_change;
mod witness;
mod witness_records;

pub use copy_records::CopyOf;
pub use listener::ClusterListener;
pub use peer_tables::PeerView;
pub use remote_get::RemoteFound;
pub use state::{Cluster, ClusterConfig, Remote};
