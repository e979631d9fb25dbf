//! One peer request as the store thread receives it: the gRPC handlers
//! (`grpc.rs`) turn each call into a [`PeerCall`] with a oneshot for the
//! answer, and `answer/` answers it from the node.

use shoal_cluster::proto::{
    AcquireReply, AllocateReply, AttachReadsReply, HeartbeatReply, ListReply, LookupReply,
    NamesReply, NodeStatus, Outcome, Statuses,
};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use tokio::sync::oneshot;

/// One peer request, for the store thread: one variant per RPC method,
/// each carrying its call (below) and, where the caller waits, the sender
/// of its answer.
pub(super) enum PeerCall {
    Heartbeat(Heartbeat),
    Register(Register),
    Unregister(Unregister),
    Publish(Publish),
    Lookup(Lookup),
    Restore(Restore),
    Restored(Restored),
    Adopted(Adopted),
    Witness(Witness),
    AttachReads(AttachReads),
    Acquire(Acquire),
    Release(Release),
    Delete(Delete),
    Revoke(Revoke),
    GiveBack(GiveBack),
    Allocate(Allocate),
    Seal(Seal),
    Abort(Abort),
    Cached(Cached),
    Drop(Drop),
    Status(Status),
    List(List),
    Names(Names),
    UnlinkName(UnlinkName),
    RenameName(RenameName),
}

pub(super) struct Heartbeat {
    pub from: u32,
    /// Whether `from` is in touch with the membership service (`None`:
    /// it has none).
    pub membership_link: Option<bool>,
    pub incarnation: u64,
    /// `from`'s fence epoch for this node, and this node's it confirms.
    pub fence_epoch: u64,
    pub fence_confirmed: u64,
    pub reply: oneshot::Sender<HeartbeatReply>,
}

pub(super) struct Register {
    pub ids: Vec<ObjectId>,
    pub owner: u32,
    /// The owner's incarnation (0: unknown).
    pub incarnation: u64,
    pub reply: oneshot::Sender<Statuses>,
}

pub(super) struct Unregister {
    pub ids: Vec<ObjectId>,
    pub owner: u32,
}

pub(super) struct Publish {
    pub ids: Vec<ObjectId>,
    pub locations: Vec<ObjectLocation>,
    pub owner: u32,
    pub reply: oneshot::Sender<()>,
}

/// Refused (the error) while this node's directory is being rebuilt.
pub(super) struct Lookup {
    pub ids: Vec<ObjectId>,
    pub reply: oneshot::Sender<Result<LookupReply, tonic::Status>>,
}

/// A peer re-registers what it holds whose home is this node.
pub(super) struct Restore {
    pub from: u32,
    /// The caller's incarnation (0: unknown).
    pub incarnation: u64,
    pub sealed: Vec<(ObjectId, ObjectLocation)>,
    pub pending: Vec<ObjectId>,
    pub copies: Vec<ObjectId>,
    pub reply: oneshot::Sender<Statuses>,
}

/// A peer finished restoring for our incarnation `incarnation`, by the
/// view numbered `epoch` (`None` from a node without a membership service).
pub(super) struct Restored {
    pub from: u32,
    pub incarnation: u64,
    pub epoch: Option<u64>,
}

/// A peer adopted the backing store of `origin`, a node removed for good,
/// and serves `objects` of it now.
pub(super) struct Adopted {
    pub from: u32,
    pub origin: u32,
    pub objects: u64,
}

/// A peer's ids it is home of itself, to keep as their witness
/// (`cluster/witness.rs`).
pub(super) struct Witness {
    pub from: u32,
    pub epoch: u64,
    pub reset: bool,
    pub sealed: Vec<ObjectId>,
    pub gone: Vec<ObjectId>,
}

/// A peer's client counts references here (`fd` of process `pid`;
/// `None`: only describe the index).
pub(super) struct AttachReads {
    pub from: u32,
    pub incarnation: u64,
    pub table: Option<(u32, i32)>,
    pub key: u64,
    pub reply: oneshot::Sender<Result<AttachReadsReply, tonic::Status>>,
}

pub(super) struct Acquire {
    pub ids: Vec<ObjectId>,
    pub from: u32,
    /// The caller's incarnation (0: unknown).
    pub incarnation: u64,
    /// Its number and the caller's settled mark (`cluster::ref_ledger`).
    pub seq: u64,
    pub settled: u64,
    pub reply: oneshot::Sender<AcquireReply>,
}

pub(super) struct Release {
    pub ids: Vec<ObjectId>,
    pub from: u32,
    /// This node's fence epoch for `from`, as `from` knew it.
    pub fence_epoch: u64,
    /// Its number, the caller's settled mark and the Acquires it undoes
    /// (`cluster::ref_ledger`).
    pub seq: u64,
    pub settled: u64,
    pub undo: Vec<u64>,
    /// This node's incarnation as `from` knew it (0: unknown).
    pub callee_incarnation: u64,
}

pub(super) struct Delete {
    pub ids: Vec<ObjectId>,
    pub reply: oneshot::Sender<Statuses>,
}

/// The owner `from` deleted these ids: stop lending them (`loans`).
pub(super) struct Revoke {
    pub ids: Vec<ObjectId>,
    pub number: u64,
    pub from: u32,
    pub reply: oneshot::Sender<Vec<ObjectId>>,
}

/// The owner `from` is short of space: give up idle loans.
pub(super) struct GiveBack {
    pub from: u32,
    pub reply: oneshot::Sender<Vec<ObjectId>>,
}

pub(super) struct Allocate {
    pub specs: Vec<(ObjectId, u64, u32)>,
    pub timeout_ms: u32,
    pub from: u32,
    /// The caller's incarnation (0: unknown).
    pub incarnation: u64,
    pub reply: oneshot::Sender<AllocateReply>,
}

pub(super) struct Seal {
    pub ids: Vec<ObjectId>,
    pub release: bool,
    pub from: u32,
    pub reply: oneshot::Sender<Outcome>,
}

pub(super) struct Abort {
    pub ids: Vec<ObjectId>,
    pub from: u32,
    pub reply: oneshot::Sender<Outcome>,
}

pub(super) struct Cached {
    pub ids: Vec<ObjectId>,
    pub owner: u32,
    pub locations: Vec<ObjectLocation>,
    pub from: u32,
    pub reply: oneshot::Sender<Statuses>,
}

pub(super) struct Drop {
    pub ids: Vec<ObjectId>,
}

pub(super) struct Status {
    pub reply: oneshot::Sender<NodeStatus>,
}

pub(super) struct List {
    pub reply: oneshot::Sender<ListReply>,
}

/// This node's own names (the cluster's namespace is their union).
pub(super) struct Names {
    pub prefix: String,
    pub exact: bool,
    pub reply: oneshot::Sender<NamesReply>,
}

pub(super) struct UnlinkName {
    pub name: String,
    pub older_than_ms: u64,
    pub from: u32,
    pub reply: oneshot::Sender<Outcome>,
}

pub(super) struct RenameName {
    pub from: String,
    pub to: String,
    pub from_node: u32,
    pub reply: oneshot::Sender<Outcome>,
}

impl PeerCall {
    /// A debug-level span for answering this call: the method, the calling
    /// node where the call names it, the first object id and how many.
    pub(super) fn span(&self) -> tracing::Span {
        use PeerCall as C;
        let (method, from, ids): (&str, Option<u32>, &[ObjectId]) = match self {
            C::Heartbeat(c) => ("heartbeat", Some(c.from), &[]),
            C::Register(c) => ("register", Some(c.owner), &c.ids),
            C::Unregister(c) => ("unregister", Some(c.owner), &c.ids),
            C::Publish(c) => ("publish", Some(c.owner), &c.ids),
            C::Lookup(c) => ("lookup", None, &c.ids),
            C::Restore(c) => ("restore", Some(c.from), &c.pending),
            C::Restored(c) => ("restored", Some(c.from), &[]),
            C::Adopted(c) => ("adopted", Some(c.from), &[]),
            C::Witness(c) => ("witness", Some(c.from), &c.sealed),
            C::Acquire(c) => ("acquire", Some(c.from), &c.ids),
            C::AttachReads(c) => ("attach_reads", Some(c.from), &[]),
            C::Release(c) => ("release", Some(c.from), &c.ids),
            C::Delete(c) => ("delete", None, &c.ids),
            C::Revoke(c) => ("revoke", Some(c.from), &c.ids),
            C::GiveBack(c) => ("give_back", Some(c.from), &[]),
            C::Allocate(c) => ("allocate", Some(c.from), &[]),
            C::Seal(c) => ("seal", Some(c.from), &c.ids),
            C::Abort(c) => ("abort", Some(c.from), &c.ids),
            C::Cached(c) => ("cached", Some(c.from), &c.ids),
            C::Drop(c) => ("drop", None, &c.ids),
            C::Status(_) => ("status", None, &[]),
            C::List(_) => ("list", None, &[]),
            C::Names(_) => ("names", None, &[]),
            C::UnlinkName(c) => ("unlink_name", Some(c.from), &[]),
            C::RenameName(c) => ("rename_name", Some(c.from_node), &[]),
        };
        tracing::debug_span!(
            "peer_request",
            method,
            from,
            id = ids.first().map(tracing::field::display),
            objects = ids.len()
        )
    }
}
