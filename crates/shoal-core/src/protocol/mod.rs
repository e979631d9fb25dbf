//! The local wire protocol between clients and their daemon.
//!
//! Length-prefixed binary frames over a Unix stream socket, little-endian,
//! fixed layouts (see docs/protocol.md for the byte-by-byte description).
//! Requests are answered in order, one reply each, except `Release` which has
//! none (so dropping a buffer never waits on the daemon). The region's file
//! descriptor travels once, beside the `Welcome` reply, as SCM_RIGHTS.
//!
//! Why hand-written rather than protobuf: the frames are a few fixed fields
//! and id arrays; a fixed layout decodes without allocation per field, is
//! trivially fuzzed, and is described exactly in the protocol document.

mod capacity_report;
mod codec;
mod create_spec;
mod frame;
mod located;
mod name_entry;
mod opcodes;
mod peer_region;
mod reply;
mod request;
mod store_report;
mod tier_report;

pub use capacity_report::{CapacityReport, PsiAction, TracePoint};
pub use codec::{Reader, Writer};
pub use create_spec::CreateSpec;
pub use frame::{FrameHeader, FRAME_HEADER_LEN, MAX_FRAME_LEN};
pub use located::Located;
pub use name_entry::NameEntry;
pub use peer_region::PeerRegion;
pub use reply::Reply;
pub use request::{decode_request, Request, WAIT_FOREVER};
pub use store_report::{ObjectInfo, StoreStats, POLICY_NAMES};
pub use tier_report::{TierInfo, TierReport};

/// 2: Get answers carry the node holding each object; `ClusterInfo`.
/// 3: objects on other nodes (Get answers, `Created` for `CreateOn`) carry
/// the generation of that node's region, so a client never reads a restarted
/// node's new region through a descriptor of its old one (or the reverse).
/// 4: an `Objects` entry's first byte also says whether the reader must
/// invalidate the object before reading it (`Located::invalidate`).
/// 5: tiers below memory: `Seal` carries a durability, `WaitDurable`,
/// `StageIn`, `StageOut`, `Tiers`; `List` rows say whether the object is in
/// memory and which tiers hold it.
/// 6: names (the POSIX view): `Name`, `Resolve`, `ListNames`, `Rename`,
/// `Unlink`; error kind `NameTooLong`. `Capacity`: the elastic capacity
/// controller's state and trace.
/// 7: `FastReads`: the shared object index and this client's reference
/// table, two fds beside the `FastReads` reply (docs/fast-path.md).
/// 8: `FastWrites` (this client's write channel and the daemon's doorbell,
/// two fds beside the reply) and `Lend` / `Lent`: creates in lent space,
/// sealed through the write channel (docs/fast-path.md).
/// 9: `PeerReads`: other nodes' indexes and this client's reference tables
/// there, two fds per node beside the reply (docs/fast-path.md "Gets of
/// other nodes' objects").
/// 10: `Resize`: an unsealed object shrinks, or grows in place, before its
/// seal (the POSIX view writes files straight into store objects).
/// 11: `Create { growing }`: objects that will grow are placed with room
/// after them.
/// 12: `Staged`: the answer to a `CreateOn` for a node whose memory is
/// reached over the network only: the client writes staging buffers in its
/// own node's region, and the seal pushes them to that node.
/// 13: `SetMtime`: a name's modification time is settable (utimens on the
/// mount).
/// 14: a `Notification` says whether a removed object was deleted (kind 3)
/// or evicted (kind 2): the wire carries the store's own event
/// (`ObjectEvent`).
/// 15: seals to memory unanswered; deletes and contains through the write
/// channel (docs/fast-path.md).
/// 16: `ClusterInfo` carries the cluster's identity (its name and a digest
/// of its token).
/// 17: `ClusterInfo` says how peer traffic is protected (TLS or not).
/// 18: `Cool`: objects their readers are done with leave memory first.
pub const PROTOCOL_VERSION: u32 = 18;

#[cfg(test)]
mod doc_check;
#[cfg(test)]
mod tests;
