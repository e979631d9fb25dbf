//! One peer request as the store thread receives it: the gRPC handlers
//! (`grpc.rs`) turn each call into a [`PeerCall`] with a oneshot for the
//! answer, and `answer.rs` answers it from the node.

use shoal_cluster::proto::{
    AcquireReply, AllocateReply, AttachReadsReply, HeartbeatReply, ListReply, LookupReply,
    NamesReply, NodeStatus, Outcome, Statuses,
};
use shoal_core::location::ObjectLocation;
use shoal_core::ObjectId;
use tokio::sync::oneshot;
use tonic::Status;

/// One peer request, for the store thread.
pub enum PeerCall {
    Heartbeat {
        from: u32,
        incarnation: u64,
        /// `from`'s fence epoch for this node, and this node's it confirms.
        fence_epoch: u64,
        fence_confirmed: u64,
        reply: oneshot::Sender<HeartbeatReply>,
    },
    Register {
        ids: Vec<ObjectId>,
        owner: u32,
        /// The owner's incarnation (0: unknown).
        incarnation: u64,
        reply: oneshot::Sender<Statuses>,
    },
    Unregister {
        ids: Vec<ObjectId>,
        owner: u32,
    },
    Publish {
        ids: Vec<ObjectId>,
        locations: Vec<ObjectLocation>,
        owner: u32,
        reply: oneshot::Sender<()>,
    },
    /// Refused (the error) while this node's directory is being rebuilt.
    Lookup {
        ids: Vec<ObjectId>,
        reply: oneshot::Sender<Result<LookupReply, Status>>,
    },
    /// A peer re-registers what it holds whose home is this node.
    Restore {
        from: u32,
        /// The caller's incarnation (0: unknown).
        incarnation: u64,
        sealed: Vec<(ObjectId, ObjectLocation)>,
        pending: Vec<ObjectId>,
        copies: Vec<ObjectId>,
        reply: oneshot::Sender<Statuses>,
    },
    /// A peer finished restoring for our incarnation `incarnation`.
    Restored {
        from: u32,
        incarnation: u64,
    },
    /// A peer's client counts references here (`fd` of process `pid`;
    /// `None`: only describe the index).
    AttachReads {
        from: u32,
        incarnation: u64,
        table: Option<(u32, i32)>,
        key: u64,
        reply: oneshot::Sender<Result<AttachReadsReply, Status>>,
    },
    Acquire {
        ids: Vec<ObjectId>,
        from: u32,
        /// The caller's incarnation (0: unknown).
        incarnation: u64,
        /// Its number and the caller's settled mark (`cluster::ref_ledger`).
        seq: u64,
        settled: u64,
        reply: oneshot::Sender<AcquireReply>,
    },
    Release {
        ids: Vec<ObjectId>,
        from: u32,
        /// This node's fence epoch for `from`, as `from` knew it.
        fence_epoch: u64,
        /// Its number, the caller's settled mark and the Acquires it undoes
        /// (`cluster::ref_ledger`).
        seq: u64,
        settled: u64,
        undo: Vec<u64>,
        /// This node's incarnation as `from` knew it (0: unknown).
        callee_incarnation: u64,
    },
    Delete {
        ids: Vec<ObjectId>,
        reply: oneshot::Sender<Statuses>,
    },
    /// The owner `from` deleted these ids: stop lending them (`loans`).
    Revoke {
        ids: Vec<ObjectId>,
        number: u64,
        from: u32,
        reply: oneshot::Sender<Vec<ObjectId>>,
    },
    /// The owner `from` is short of space: give up idle loans.
    GiveBack {
        from: u32,
        reply: oneshot::Sender<Vec<ObjectId>>,
    },
    Allocate {
        specs: Vec<(ObjectId, u64, u32)>,
        timeout_ms: u32,
        from: u32,
        /// The caller's incarnation (0: unknown).
        incarnation: u64,
        reply: oneshot::Sender<AllocateReply>,
    },
    Seal {
        ids: Vec<ObjectId>,
        release: bool,
        from: u32,
        reply: oneshot::Sender<Outcome>,
    },
    Abort {
        ids: Vec<ObjectId>,
        from: u32,
        reply: oneshot::Sender<Outcome>,
    },
    Cached {
        ids: Vec<ObjectId>,
        owner: u32,
        locations: Vec<ObjectLocation>,
        from: u32,
        reply: oneshot::Sender<Statuses>,
    },
    Drop {
        ids: Vec<ObjectId>,
    },
    Status {
        reply: oneshot::Sender<NodeStatus>,
    },
    List {
        reply: oneshot::Sender<ListReply>,
    },
    /// This node's own names (the cluster's namespace is their union).
    Names {
        prefix: String,
        exact: bool,
        reply: oneshot::Sender<NamesReply>,
    },
    UnlinkName {
        name: String,
        older_than_ms: u64,
        from: u32,
        reply: oneshot::Sender<Outcome>,
    },
    RenameName {
        from: String,
        to: String,
        from_node: u32,
        reply: oneshot::Sender<Outcome>,
    },
}

impl PeerCall {
    /// A debug-level span for answering this call: the method, the calling
    /// node where the call names it, the first object id and how many.
    pub fn span(&self) -> tracing::Span {
        use PeerCall as C;
        let (method, from, ids): (&str, Option<u32>, &[ObjectId]) = match self {
            C::Heartbeat { from, .. } => ("heartbeat", Some(*from), &[]),
            C::Register { ids, owner, .. } => ("register", Some(*owner), ids),
            C::Unregister { ids, owner } => ("unregister", Some(*owner), ids),
            C::Publish { ids, owner, .. } => ("publish", Some(*owner), ids),
            C::Lookup { ids, .. } => ("lookup", None, ids),
            C::Restore { from, pending, .. } => ("restore", Some(*from), pending),
            C::Restored { from, .. } => ("restored", Some(*from), &[]),
            C::Acquire { ids, from, .. } => ("acquire", Some(*from), ids),
            C::AttachReads { from, .. } => ("attach_reads", Some(*from), &[]),
            C::Release { ids, from, .. } => ("release", Some(*from), ids),
            C::Delete { ids, .. } => ("delete", None, ids),
            C::Revoke { ids, from, .. } => ("revoke", Some(*from), ids),
            C::GiveBack { from, .. } => ("give_back", Some(*from), &[]),
            C::Allocate { from, .. } => ("allocate", Some(*from), &[]),
            C::Seal { ids, from, .. } => ("seal", Some(*from), ids),
            C::Abort { ids, from, .. } => ("abort", Some(*from), ids),
            C::Cached { ids, from, .. } => ("cached", Some(*from), ids),
            C::Drop { ids } => ("drop", None, ids),
            C::Status { .. } => ("status", None, &[]),
            C::List { .. } => ("list", None, &[]),
            C::Names { .. } => ("names", None, &[]),
            C::UnlinkName { from, .. } => ("unlink_name", Some(*from), &[]),
            C::RenameName { from_node, .. } => ("rename_name", Some(*from_node), &[]),
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
