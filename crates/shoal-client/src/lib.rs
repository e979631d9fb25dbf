//! The Rust client of a local shoal daemon.
//!
//! A client connects to the daemon's Unix socket, receives the region's file
//! descriptor once and maps it. From then on objects are (offset, size) pairs
//! into that mapping: a get is a lookup, never a copy. The client is
//! synchronous (one request in flight); batch calls exist so that many
//! objects cost one round trip. [`shared::SharedClient`] shares one
//! connection between threads, with references released when dropped, and
//! hands out [`shared::ObjectView`]s: an object's bytes with the reference
//! that keeps them.
//!
//! [`Client`] is one struct; its methods are grouped by concern, one
//! `impl Client` block per file:
//!
//! | file | what it holds |
//! | --- | --- |
//! | `channel.rs` | the framed socket: requests out, replies in, busy polling, the handshake, fds |
//! | `connect.rs` | connecting, asking for the fast paths, what the daemon said, hanging up |
//! | `objects.rs` | create, write, seal, abort, resize, get, release, delete, contains, list, put |
//! | `fast.rs` | the fast path: gets through the shared indexes, creates in lent space |
//! | `fast_held.rs` | a reference the fast path took |
//! | `cluster.rs` | other nodes: their regions mapped here, remote allocation, addresses |
//! | `cluster_view.rs` | [`ClusterView`]: the nodes, and what this process maps of each |
//! | `coherence.rs` | non-coherent fabrics: flush before a seal, invalidate before a read |
//! | `names.rs` | the POSIX view's names |
//! | `tiers.rs` | durability and the tiers below memory |
//! | `store.rs` | the store as a whole: statistics, eviction, the capacity controller |
//! | `subscriptions.rs` | [`Subscription`], notifications of seals and removals |
//! | `lent.rs`, `peer_reads.rs` | the fast path's bookkeeping (lent space, other nodes' indexes) |
//! | `shared.rs` | [`shared::SharedClient`], [`shared::ObjectRef`], [`shared::ObjectView`] |

#![warn(missing_docs)]

mod channel;
mod cluster;
mod cluster_view;
mod coherence;
mod connect;
mod fast;
mod fast_held;
mod lent;
mod names;
mod objects;
mod peer_reads;
pub mod shared;
mod store;
mod subscriptions;
mod tiers;

use std::collections::HashMap;
use std::sync::Arc;

use shoal_core::fast_path::readers::FastReads;
use shoal_core::region::Mapping;
use shoal_core::ObjectId;

pub use channel::StoreInfo;
pub use cluster_view::ClusterView;
pub use shoal_core::durability::Durability;
pub use shoal_core::protocol::WAIT_FOREVER;
pub use shoal_core::protocol::{Located, NameEntry, PeerRegion, TierInfo, TierReport};
pub use subscriptions::Subscription;

/// A connection to the local daemon and its region, mapped here.
pub struct Client {
    channel: channel::Channel,
    mapping: Arc<Mapping>,
    info: StoreInfo,
    cluster: Option<ClusterView>,
    /// Objects created here (where, in which generation of that node's
    /// region) and not sealed yet, flushed at seal on a non-coherent fabric.
    unsealed: HashMap<ObjectId, Located>,
    /// The fast path (docs/fast-path.md): gets of published objects without
    /// a round trip. `None` if the daemon does not offer it, or
    /// `SHOAL_FAST_READS=0`.
    fast: Option<Arc<FastReads>>,
    /// References taken through the fast path, by id: where each is
    /// counted (one per reference).
    fast_held: HashMap<ObjectId, Vec<fast_held::FastHeld>>,
    /// In a cluster: other nodes' indexes and this client's tables there
    /// (docs/fast-path.md "Gets of other nodes' objects"), asked for at
    /// the first get that misses the local index.
    peer_views: Arc<peer_reads::PeerViews>,
    /// Creates in lent space, sealed and released through the write
    /// channel (docs/fast-path.md). `None` without the fast path, in a
    /// cluster, or with `SHOAL_FAST_WRITES=0`.
    writes: Option<lent::FastWrites>,
}
