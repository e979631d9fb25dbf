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
mod frame;
mod store_report;
mod tier_report;

pub use capacity_report::{CapacityReport, PsiAction, TracePoint};
pub use codec::{Reader, Writer};
pub use frame::{FrameHeader, FRAME_HEADER_LEN, MAX_FRAME_LEN};
pub use store_report::{ObjectInfo, StoreStats, POLICY_NAMES};
pub use tier_report::{TierInfo, TierReport};

use crate::durability::Durability;
use crate::error::{ErrorKind, Result, ShoalError};
use crate::ids::ObjectId;
use crate::location::ObjectLocation;

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
pub const PROTOCOL_VERSION: u32 = 13;

/// A timeout meaning "wait forever".
pub const WAIT_FOREVER: i64 = -1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSpec {
    pub id: ObjectId,
    pub data_size: u64,
    pub meta_size: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Hello {
        version: u32,
        pid: u32,
    },
    /// Create all or none; wait up to `timeout_ms` for space if the store is full.
    /// `growing`: the objects will grow through `Resize` (files being
    /// written): each is placed with free room after it where the store has
    /// some, not packed beside the last one created.
    Create {
        timeout_ms: u32,
        objects: Vec<CreateSpec>,
        growing: bool,
    },
    /// `durability`: acknowledged only once every object reached it
    /// (`None`: the node's default).
    Seal {
        release: bool,
        durability: Option<Durability>,
        ids: Vec<ObjectId>,
    },
    Abort {
        id: ObjectId,
    },
    /// Resizes an unsealed object this client created (socket-created, no
    /// metadata) to `data_size` data bytes in place: a shrink frees the
    /// block's tail, a growth takes the free space right after it.
    /// Answered by `Bool`: false when a growth found no room there (the
    /// object is unchanged; create a larger one instead).
    Resize {
        id: ObjectId,
        data_size: u64,
    },
    /// Wait until every id is sealed or `timeout_ms` passes (-1: forever).
    Get {
        timeout_ms: i64,
        ids: Vec<ObjectId>,
    },
    /// One-way: no reply.
    Release {
        ids: Vec<ObjectId>,
    },
    Delete {
        ids: Vec<ObjectId>,
    },
    Contains {
        id: ObjectId,
    },
    List,
    Stats,
    /// Turns this connection into a stream of `Notification` replies.
    Subscribe,
    Evict {
        bytes: u64,
    },
    /// The cluster this daemon belongs to, so the client can map peers' regions.
    ClusterInfo,
    /// The fast path's shared state: answered by `FastReads` with the
    /// object index's fd and a fresh reference table's fd attached (in that
    /// order), or an error if the daemon does not offer it.
    FastReads,
    /// The fast path's write channel: answered by `FastWrites` with the
    /// channel's fd and the daemon's doorbell (an eventfd) attached, or an
    /// error if the daemon does not offer it (it needs `FastReads` first).
    FastWrites,
    /// Asks for a block of about `bytes` of free space to create objects
    /// in without a round trip each; answered by `Lent` (len 0: none now).
    Lend {
        bytes: u64,
    },
    /// In a cluster: the indexes of the owners whose objects this client may
    /// get without a round trip, and a reference table at each; answered
    /// by `PeerReads` with two fds per owner (index, table) in its order.
    PeerReads,
    /// Like `Create`, in the region of cluster node `node` (remote
    /// allocation); offsets in a `Created` reply are in that node's region.
    /// For a node reached over the network only the reply is `Staged`.
    CreateOn {
        node: u32,
        timeout_ms: u32,
        objects: Vec<CreateSpec>,
    },
    /// Waits until every id has a durable copy at `level` or `timeout_ms`
    /// passes (-1: forever); one status per id.
    WaitDurable {
        level: Durability,
        timeout_ms: i64,
        ids: Vec<ObjectId>,
    },
    /// Brings objects into memory from the tiers below (no reference taken).
    StageIn {
        ids: Vec<ObjectId>,
    },
    /// Writes objects down to the lowest tier and frees their memory (unless
    /// referenced).
    StageOut {
        ids: Vec<ObjectId>,
    },
    /// The node's tiers, their use and the drain's progress.
    Tiers,
    /// The elastic capacity controller's state; with `trace_since`, also
    /// its trace points later than that time (since the daemon started).
    Capacity {
        trace_since: Option<std::time::Duration>,
    },
    /// Gives object `id` the name `name`. On an object this client is still
    /// writing, the name is bound when it is sealed (and goes with it to the
    /// tiers); on a sealed object, at once. A name already bound moves to the
    /// new object and the old one is deleted (readers holding it keep it).
    Name {
        id: ObjectId,
        name: String,
    },
    /// The object a name is bound to: `Named`.
    Resolve {
        name: String,
    },
    /// Every name under directory `prefix` (`""`: all), sorted: `Names`.
    ListNames {
        prefix: String,
    },
    /// Moves a name, or every name under directory `from`, to `to`; a name
    /// bound at `to` is replaced (its object deleted).
    Rename {
        from: String,
        to: String,
    },
    /// Removes a name and deletes its object.
    Unlink {
        name: String,
    },
    /// Sets the modification time a name shows (until its next binding).
    SetMtime {
        name: String,
        mtime_ms: u64,
    },
}

/// An object's name and what a file listing shows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameEntry {
    pub name: String,
    pub id: ObjectId,
    pub data_size: u64,
    pub meta_size: u32,
    /// When the name was bound to this object (its seal), ms since the epoch.
    pub mtime_ms: u64,
}

/// No durability named: the node's default (the `Seal` byte).
const DURABILITY_DEFAULT: u8 = 0xFF;

/// An object as a Get answers it: which node's region holds it, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    pub node: u32,
    /// For an object on another node: the generation of that node's region
    /// (the incarnation of the daemon that answered), which the region file
    /// the client maps must carry. 0 for the daemon's own region.
    pub generation: u64,
    pub location: ObjectLocation,
    /// Set by the owner's daemon, on a non-coherent cluster, for an object of
    /// its own region that a client of another node wrote (remote
    /// allocation): this node's caches may still hold lines of that range
    /// from what it read or wrote there before, so a reader here must
    /// invalidate the range before its first read. Objects on other nodes
    /// never carry it: their readers always invalidate on such a fabric.
    pub invalidate: bool,
}

impl Located {
    /// An object in the daemon's own region (node `node`).
    pub fn local(node: u32, location: ObjectLocation) -> Self {
        Self {
            node,
            generation: 0,
            location,
            invalidate: false,
        }
    }
}

/// The first byte of an `Objects` entry.
mod entry {
    pub const ABSENT: u8 = 0;
    pub const FOUND: u8 = 1;
    /// Found, and the reader must invalidate it first (`Located::invalidate`).
    pub const FOUND_INVALIDATE: u8 = 2;
}

/// One node as `ClusterInfo` describes it to a client on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRegion {
    pub node: u32,
    /// Its region can be mapped here (`false`: objects are pulled over the network).
    pub mapped: bool,
    pub alive: bool,
    pub region_size: u64,
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    Sealed {
        id: ObjectId,
        data_size: u64,
        meta_size: u32,
    },
    Removed {
        id: ObjectId,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Ok,
    Error {
        kind: ErrorKind,
        message: String,
    },
    /// Sent with the region's fd attached.
    Welcome {
        version: u32,
        client_id: u32,
        region_size: u64,
        capacity: u64,
        line_size: u64,
        /// The daemon keeps the whole region resident (prefaulted): a client
        /// can populate its page tables for all of it at connect without
        /// allocating memory nobody asked for.
        resident: bool,
        /// The daemon is a cluster node: ask `ClusterInfo` for the peers.
        clustered: bool,
    },
    /// `generation`: of the node's region the offsets are in (`CreateOn`
    /// on another node); 0 for the daemon's own region.
    Created {
        generation: u64,
        offsets: Vec<u64>,
    },
    /// `CreateOn` a node whose memory cannot be mapped here: the objects
    /// are allocated on that node, and the client writes them at these
    /// offsets of its own node's region (staging buffers); their seal
    /// pushes the bytes to that node.
    Staged {
        offsets: Vec<u64>,
    },
    Objects {
        objects: Vec<Option<Located>>,
    },
    Bool(bool),
    List {
        objects: Vec<ObjectInfo>,
    },
    Stats(StoreStats),
    Tiers(TierReport),
    Named(NameEntry),
    Names {
        entries: Vec<NameEntry>,
    },
    Capacity(CapacityReport),
    Notification(Notification),
    /// One status per id: `None` for success.
    Statuses {
        errors: Vec<Option<ErrorKind>>,
    },
    Evicted {
        bytes: u64,
    },
    /// Sent with two fds attached: the object index (map it read-only) and
    /// this client's reference table of `slots` u32 counts.
    FastReads {
        slots: u32,
    },
    /// Sent with two fds attached: this client's write channel (`records`
    /// records in its ring) and the daemon's doorbell.
    FastWrites {
        records: u32,
    },
    /// A block of the region lent to this client as lease number `lease`
    /// (`len` 0: none).
    Lent {
        lease: u64,
        offset: u64,
        len: u64,
    },
    /// Sent with two fds per entry attached (the owner's index, then this
    /// client's table there): per owner node, its incarnation (its region's
    /// generation).
    PeerReads {
        owners: Vec<(u32, u64)>,
    },
    /// `node` is this daemon's id; `coherent` false means clients flush
    /// before seal and invalidate before the first read of remote objects
    /// (and of local ones marked `Located::invalidate`).
    ClusterInfo {
        node: u32,
        coherent: bool,
        /// Emulation only: clients keep a private copy of every region as
        /// their "cache", synchronised only by flush and invalidate, so the
        /// coherency protocol is exercised on one host.
        simulated: bool,
        nodes: Vec<PeerRegion>,
    },
}

/// The body of Create and CreateOn: timeout, then the objects.
fn encode_create(w: &mut Writer, timeout_ms: u32, objects: &[CreateSpec]) {
    w.u32(timeout_ms).u32(objects.len() as u32);
    for o in objects {
        w.id(&o.id).u64(o.data_size).u32(o.meta_size);
    }
}

fn decode_create(r: &mut Reader<'_>) -> Result<(u32, Vec<CreateSpec>)> {
    let timeout_ms = r.u32()?;
    let n = r.count(20 + 8 + 4)?;
    let mut objects = Vec::with_capacity(n);
    for _ in 0..n {
        objects.push(CreateSpec {
            id: r.id()?,
            data_size: r.u64()?,
            meta_size: r.u32()?,
        });
    }
    Ok((timeout_ms, objects))
}

mod op {
    pub const HELLO: u16 = 0x01;
    pub const CREATE: u16 = 0x02;
    pub const SEAL: u16 = 0x03;
    pub const ABORT: u16 = 0x04;
    pub const GET: u16 = 0x05;
    pub const RELEASE: u16 = 0x06;
    pub const DELETE: u16 = 0x07;
    pub const CONTAINS: u16 = 0x08;
    pub const LIST: u16 = 0x09;
    pub const STATS: u16 = 0x0A;
    pub const SUBSCRIBE: u16 = 0x0B;
    pub const EVICT: u16 = 0x0C;
    pub const CLUSTER_INFO: u16 = 0x0D;
    pub const CREATE_ON: u16 = 0x0E;
    pub const WAIT_DURABLE: u16 = 0x0F;
    pub const STAGE_IN: u16 = 0x10;
    pub const STAGE_OUT: u16 = 0x11;
    pub const TIERS: u16 = 0x12;
    pub const NAME: u16 = 0x13;
    pub const RESOLVE: u16 = 0x14;
    pub const LIST_NAMES: u16 = 0x15;
    pub const RENAME: u16 = 0x16;
    pub const UNLINK: u16 = 0x17;
    pub const CAPACITY: u16 = 0x18;
    pub const FAST_READS: u16 = 0x19;
    pub const FAST_WRITES: u16 = 0x1A;
    pub const LEND: u16 = 0x1B;
    pub const PEER_READS: u16 = 0x1C;
    pub const RESIZE: u16 = 0x1D;
    pub const SET_MTIME: u16 = 0x1E;

    pub const OK: u16 = 0x80;
    pub const ERROR: u16 = 0x81;
    pub const WELCOME: u16 = 0x82;
    pub const CREATED: u16 = 0x83;
    pub const OBJECTS: u16 = 0x84;
    pub const BOOL: u16 = 0x85;
    pub const LIST_REPLY: u16 = 0x86;
    pub const STATS_REPLY: u16 = 0x87;
    pub const NOTIFICATION: u16 = 0x88;
    pub const STATUSES: u16 = 0x89;
    pub const EVICTED: u16 = 0x8A;
    pub const CLUSTER_REPLY: u16 = 0x8B;
    pub const TIERS_REPLY: u16 = 0x8C;
    pub const NAMED: u16 = 0x8D;
    pub const NAMES: u16 = 0x8E;
    pub const CAPACITY_REPLY: u16 = 0x8F;
    pub const FAST_READS_REPLY: u16 = 0x90;
    pub const FAST_WRITES_REPLY: u16 = 0x91;
    pub const LENT: u16 = 0x92;
    pub const PEER_READS_REPLY: u16 = 0x93;
    pub const STAGED: u16 = 0x94;
}

impl Request {
    /// Appends the whole frame (header + payload) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::frame(out);
        let opcode = match self {
            Request::Hello { version, pid } => {
                w.u32(*version).u32(*pid);
                op::HELLO
            }
            Request::Create {
                timeout_ms,
                objects,
                growing,
            } => {
                encode_create(&mut w, *timeout_ms, objects);
                w.u8(*growing as u8);
                op::CREATE
            }
            Request::Seal {
                release,
                durability,
                ids,
            } => {
                w.u8(*release as u8)
                    .u8(durability.map_or(DURABILITY_DEFAULT, |d| d as u8))
                    .ids(ids);
                op::SEAL
            }
            Request::Abort { id } => {
                w.id(id);
                op::ABORT
            }
            Request::Resize { id, data_size } => {
                w.id(id).u64(*data_size);
                op::RESIZE
            }
            Request::Get { timeout_ms, ids } => {
                w.i64(*timeout_ms).ids(ids);
                op::GET
            }
            Request::Release { ids } => {
                w.ids(ids);
                op::RELEASE
            }
            Request::Delete { ids } => {
                w.ids(ids);
                op::DELETE
            }
            Request::Contains { id } => {
                w.id(id);
                op::CONTAINS
            }
            Request::List => op::LIST,
            Request::Stats => op::STATS,
            Request::Subscribe => op::SUBSCRIBE,
            Request::Evict { bytes } => {
                w.u64(*bytes);
                op::EVICT
            }
            Request::ClusterInfo => op::CLUSTER_INFO,
            Request::FastReads => op::FAST_READS,
            Request::FastWrites => op::FAST_WRITES,
            Request::PeerReads => op::PEER_READS,
            Request::Lend { bytes } => {
                w.u64(*bytes);
                op::LEND
            }
            Request::CreateOn {
                node,
                timeout_ms,
                objects,
            } => {
                w.u32(*node);
                encode_create(&mut w, *timeout_ms, objects);
                op::CREATE_ON
            }
            Request::WaitDurable {
                level,
                timeout_ms,
                ids,
            } => {
                w.u8(*level as u8).i64(*timeout_ms).ids(ids);
                op::WAIT_DURABLE
            }
            Request::StageIn { ids } => {
                w.ids(ids);
                op::STAGE_IN
            }
            Request::StageOut { ids } => {
                w.ids(ids);
                op::STAGE_OUT
            }
            Request::Tiers => op::TIERS,
            Request::Name { id, name } => {
                w.id(id).str(name);
                op::NAME
            }
            Request::Resolve { name } => {
                w.str(name);
                op::RESOLVE
            }
            Request::ListNames { prefix } => {
                w.str(prefix);
                op::LIST_NAMES
            }
            Request::Rename { from, to } => {
                w.str(from).str(to);
                op::RENAME
            }
            Request::Unlink { name } => {
                w.str(name);
                op::UNLINK
            }
            Request::SetMtime { name, mtime_ms } => {
                w.str(name).u64(*mtime_ms);
                op::SET_MTIME
            }
            Request::Capacity { trace_since } => {
                // -1: no trace wanted.
                w.i64(trace_since.map_or(-1, |t| t.as_micros() as i64));
                op::CAPACITY
            }
        };
        w.finish(opcode);
    }

    pub fn decode(header: FrameHeader, payload: &[u8]) -> Result<Self> {
        let mut r = Reader::new(payload);
        let request = match header.opcode {
            op::HELLO => Request::Hello {
                version: r.u32()?,
                pid: r.u32()?,
            },
            op::CREATE => {
                let (timeout_ms, objects) = decode_create(&mut r)?;
                Request::Create {
                    timeout_ms,
                    objects,
                    growing: r.bool()?,
                }
            }
            op::SEAL => Request::Seal {
                release: r.bool()?,
                durability: match r.u8()? {
                    DURABILITY_DEFAULT => None,
                    level => Some(durability(level)?),
                },
                ids: r.ids()?,
            },
            op::ABORT => Request::Abort { id: r.id()? },
            op::RESIZE => Request::Resize {
                id: r.id()?,
                data_size: r.u64()?,
            },
            op::GET => Request::Get {
                timeout_ms: r.i64()?,
                ids: r.ids()?,
            },
            op::RELEASE => Request::Release { ids: r.ids()? },
            op::DELETE => Request::Delete { ids: r.ids()? },
            op::CONTAINS => Request::Contains { id: r.id()? },
            op::LIST => Request::List,
            op::STATS => Request::Stats,
            op::SUBSCRIBE => Request::Subscribe,
            op::EVICT => Request::Evict { bytes: r.u64()? },
            op::CLUSTER_INFO => Request::ClusterInfo,
            op::FAST_READS => Request::FastReads,
            op::FAST_WRITES => Request::FastWrites,
            op::LEND => Request::Lend { bytes: r.u64()? },
            op::PEER_READS => Request::PeerReads,
            op::CREATE_ON => {
                let node = r.u32()?;
                let (timeout_ms, objects) = decode_create(&mut r)?;
                Request::CreateOn {
                    node,
                    timeout_ms,
                    objects,
                }
            }
            op::WAIT_DURABLE => Request::WaitDurable {
                level: durability(r.u8()?)?,
                timeout_ms: r.i64()?,
                ids: r.ids()?,
            },
            op::STAGE_IN => Request::StageIn { ids: r.ids()? },
            op::STAGE_OUT => Request::StageOut { ids: r.ids()? },
            op::TIERS => Request::Tiers,
            op::NAME => Request::Name {
                id: r.id()?,
                name: r.str()?,
            },
            op::RESOLVE => Request::Resolve { name: r.str()? },
            op::LIST_NAMES => Request::ListNames { prefix: r.str()? },
            op::RENAME => Request::Rename {
                from: r.str()?,
                to: r.str()?,
            },
            op::UNLINK => Request::Unlink { name: r.str()? },
            op::SET_MTIME => Request::SetMtime {
                name: r.str()?,
                mtime_ms: r.u64()?,
            },
            op::CAPACITY => Request::Capacity {
                trace_since: match r.i64()? {
                    -1 => None,
                    micros if micros >= 0 => Some(std::time::Duration::from_micros(micros as u64)),
                    other => {
                        return Err(ShoalError::protocol(format!("invalid trace time {other}")))
                    }
                },
            },
            other => {
                return Err(ShoalError::protocol(format!(
                    "unknown request opcode {other:#06x}"
                )))
            }
        };
        r.finish()?;
        Ok(request)
    }

    /// Whether the daemon answers this request (all but `Release` do).
    pub fn expects_reply(&self) -> bool {
        !matches!(self, Request::Release { .. })
    }
}

impl Reply {
    pub fn error(err: &ShoalError) -> Self {
        Reply::Error {
            kind: err.kind(),
            message: err.message().to_owned(),
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut w = Writer::frame(out);
        let opcode = match self {
            Reply::Ok => op::OK,
            Reply::Error { kind, message } => {
                w.u16(kind.code()).str(message);
                op::ERROR
            }
            Reply::Welcome {
                version,
                client_id,
                region_size,
                capacity,
                line_size,
                resident,
                clustered,
            } => {
                w.u32(*version)
                    .u32(*client_id)
                    .u64(*region_size)
                    .u64(*capacity)
                    .u64(*line_size)
                    .u32(u32::from(*resident) | u32::from(*clustered) << 1);
                op::WELCOME
            }
            Reply::Created {
                generation,
                offsets,
            } => {
                w.u64(*generation).u32(offsets.len() as u32);
                for o in offsets {
                    w.u64(*o);
                }
                op::CREATED
            }
            Reply::Staged { offsets } => {
                w.u32(offsets.len() as u32);
                for o in offsets {
                    w.u64(*o);
                }
                op::STAGED
            }
            Reply::Objects { objects } => {
                w.u32(objects.len() as u32);
                for o in objects {
                    match o {
                        Some(Located {
                            node,
                            generation,
                            location,
                            invalidate,
                        }) => w
                            .u8(if *invalidate {
                                entry::FOUND_INVALIDATE
                            } else {
                                entry::FOUND
                            })
                            .u32(*node)
                            .u64(*generation)
                            .u64(location.offset)
                            .u64(location.data_size)
                            .u32(location.meta_size),
                        None => w.u8(entry::ABSENT).u32(0).u64(0).u64(0).u64(0).u32(0),
                    };
                }
                op::OBJECTS
            }
            Reply::Bool(b) => {
                w.u8(*b as u8);
                op::BOOL
            }
            Reply::FastReads { slots } => {
                w.u32(*slots);
                op::FAST_READS_REPLY
            }
            Reply::FastWrites { records } => {
                w.u32(*records);
                op::FAST_WRITES_REPLY
            }
            Reply::Lent { lease, offset, len } => {
                w.u64(*lease).u64(*offset).u64(*len);
                op::LENT
            }
            Reply::PeerReads { owners } => {
                w.u32(owners.len() as u32);
                for (node, generation) in owners {
                    w.u32(*node).u64(*generation);
                }
                op::PEER_READS_REPLY
            }
            Reply::List { objects } => {
                w.u32(objects.len() as u32);
                for o in objects {
                    w.id(&o.id)
                        .u64(o.location.offset)
                        .u64(o.location.data_size)
                        .u32(o.location.meta_size)
                        .u8(o.sealed as u8)
                        .u32(o.refs)
                        .u8(o.resident as u8)
                        .u8(o.tiers);
                }
                op::LIST_REPLY
            }
            Reply::Stats(s) => {
                for v in [
                    s.capacity,
                    s.region_size,
                    s.used,
                    s.objects,
                    s.sealed,
                    s.referenced,
                    s.evictable,
                    s.clients,
                    s.evictions,
                    s.evicted_bytes,
                    s.line_size,
                    s.lent,
                ] {
                    w.u64(v);
                }
                w.str(s.policy);
                op::STATS_REPLY
            }
            Reply::Tiers(report) => {
                report.encode(&mut w);
                op::TIERS_REPLY
            }
            Reply::Named(entry) => {
                encode_name_entry(&mut w, entry);
                op::NAMED
            }
            Reply::Names { entries } => {
                w.u32(entries.len() as u32);
                for entry in entries {
                    encode_name_entry(&mut w, entry);
                }
                op::NAMES
            }
            Reply::Capacity(report) => {
                report.encode(&mut w);
                op::CAPACITY_REPLY
            }
            Reply::Notification(n) => {
                match n {
                    Notification::Sealed {
                        id,
                        data_size,
                        meta_size,
                    } => w.u8(1).id(id).u64(*data_size).u32(*meta_size),
                    Notification::Removed { id } => w.u8(2).id(id).u64(0).u32(0),
                };
                op::NOTIFICATION
            }
            Reply::Statuses { errors } => {
                w.u32(errors.len() as u32);
                for e in errors {
                    w.u16(e.map_or(0, ErrorKind::code));
                }
                op::STATUSES
            }
            Reply::Evicted { bytes } => {
                w.u64(*bytes);
                op::EVICTED
            }
            Reply::ClusterInfo {
                node,
                coherent,
                simulated,
                nodes,
            } => {
                w.u32(*node)
                    .u8(u8::from(*coherent))
                    .u8(u8::from(*simulated))
                    .u32(nodes.len() as u32);
                for n in nodes {
                    w.u32(n.node)
                        .u8(u8::from(n.mapped))
                        .u8(u8::from(n.alive))
                        .u64(n.region_size)
                        .str(&n.path);
                }
                op::CLUSTER_REPLY
            }
        };
        w.finish(opcode);
    }

    pub fn decode(header: FrameHeader, payload: &[u8]) -> Result<Self> {
        let mut r = Reader::new(payload);
        let reply = match header.opcode {
            op::OK => Reply::Ok,
            op::ERROR => {
                let code = r.u16()?;
                let kind = ErrorKind::from_code(code)
                    .ok_or_else(|| ShoalError::protocol(format!("unknown error kind {code}")))?;
                Reply::Error {
                    kind,
                    message: r.str()?,
                }
            }
            op::WELCOME => {
                let (version, client_id) = (r.u32()?, r.u32()?);
                let (region_size, capacity, line_size) = (r.u64()?, r.u64()?, r.u64()?);
                let flags = r.u32()?;
                Reply::Welcome {
                    version,
                    client_id,
                    region_size,
                    capacity,
                    line_size,
                    resident: flags & 1 != 0,
                    clustered: flags & 2 != 0,
                }
            }
            op::CREATED => {
                let generation = r.u64()?;
                let n = r.count(8)?;
                Reply::Created {
                    generation,
                    offsets: (0..n).map(|_| r.u64()).collect::<Result<_>>()?,
                }
            }
            op::STAGED => {
                let n = r.count(8)?;
                Reply::Staged {
                    offsets: (0..n).map(|_| r.u64()).collect::<Result<_>>()?,
                }
            }
            op::OBJECTS => {
                let n = r.count(1 + 4 + 8 + 8 + 8 + 4)?;
                let mut objects = Vec::with_capacity(n);
                for _ in 0..n {
                    let (found, invalidate) = match r.u8()? {
                        entry::ABSENT => (false, false),
                        entry::FOUND => (true, false),
                        entry::FOUND_INVALIDATE => (true, true),
                        other => {
                            return Err(ShoalError::protocol(format!(
                                "unknown object entry state {other}"
                            )))
                        }
                    };
                    let node = r.u32()?;
                    let generation = r.u64()?;
                    let location = ObjectLocation {
                        offset: r.u64()?,
                        data_size: r.u64()?,
                        meta_size: r.u32()?,
                    };
                    objects.push(found.then_some(Located {
                        node,
                        generation,
                        location,
                        invalidate,
                    }));
                }
                Reply::Objects { objects }
            }
            op::BOOL => Reply::Bool(r.bool()?),
            op::FAST_READS_REPLY => Reply::FastReads { slots: r.u32()? },
            op::FAST_WRITES_REPLY => Reply::FastWrites { records: r.u32()? },
            op::LENT => Reply::Lent {
                lease: r.u64()?,
                offset: r.u64()?,
                len: r.u64()?,
            },
            op::PEER_READS_REPLY => {
                let n = r.count(4 + 8)?;
                let mut owners = Vec::with_capacity(n);
                for _ in 0..n {
                    owners.push((r.u32()?, r.u64()?));
                }
                Reply::PeerReads { owners }
            }
            op::LIST_REPLY => {
                let n = r.count(20 + 8 + 8 + 4 + 1 + 4 + 1 + 1)?;
                let mut objects = Vec::with_capacity(n);
                for _ in 0..n {
                    let id = r.id()?;
                    let location = ObjectLocation {
                        offset: r.u64()?,
                        data_size: r.u64()?,
                        meta_size: r.u32()?,
                    };
                    objects.push(ObjectInfo {
                        id,
                        location,
                        sealed: r.bool()?,
                        refs: r.u32()?,
                        resident: r.bool()?,
                        tiers: r.u8()?,
                    });
                }
                Reply::List { objects }
            }
            op::STATS_REPLY => {
                let mut s = StoreStats {
                    capacity: r.u64()?,
                    region_size: r.u64()?,
                    used: r.u64()?,
                    objects: r.u64()?,
                    sealed: r.u64()?,
                    referenced: r.u64()?,
                    evictable: r.u64()?,
                    clients: r.u64()?,
                    evictions: r.u64()?,
                    evicted_bytes: r.u64()?,
                    line_size: r.u64()?,
                    lent: r.u64()?,
                    policy: "",
                };
                let name = r.str()?;
                s.policy = POLICY_NAMES
                    .into_iter()
                    .find(|known| *known == name)
                    .unwrap_or("other");
                Reply::Stats(s)
            }
            op::TIERS_REPLY => Reply::Tiers(TierReport::decode(&mut r)?),
            op::NAMED => Reply::Named(decode_name_entry(&mut r)?),
            op::NAMES => {
                let n = r.count(20 + 8 + 4 + 8 + 4)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push(decode_name_entry(&mut r)?);
                }
                Reply::Names { entries }
            }
            op::CAPACITY_REPLY => Reply::Capacity(CapacityReport::decode(&mut r)?),
            op::NOTIFICATION => {
                let kind = r.u8()?;
                let id = r.id()?;
                let (data_size, meta_size) = (r.u64()?, r.u32()?);
                Reply::Notification(match kind {
                    1 => Notification::Sealed {
                        id,
                        data_size,
                        meta_size,
                    },
                    2 => Notification::Removed { id },
                    other => {
                        return Err(ShoalError::protocol(format!(
                            "unknown notification kind {other}"
                        )))
                    }
                })
            }
            op::STATUSES => {
                let n = r.count(2)?;
                let mut errors = Vec::with_capacity(n);
                for _ in 0..n {
                    let code = r.u16()?;
                    errors.push(if code == 0 {
                        None
                    } else {
                        Some(ErrorKind::from_code(code).ok_or_else(|| {
                            ShoalError::protocol(format!("unknown error kind {code}"))
                        })?)
                    });
                }
                Reply::Statuses { errors }
            }
            op::EVICTED => Reply::Evicted { bytes: r.u64()? },
            op::CLUSTER_REPLY => {
                let node = r.u32()?;
                let coherent = r.bool()?;
                let simulated = r.bool()?;
                let n = r.count(4 + 1 + 1 + 8 + 4)?;
                let mut nodes = Vec::with_capacity(n);
                for _ in 0..n {
                    nodes.push(PeerRegion {
                        node: r.u32()?,
                        mapped: r.bool()?,
                        alive: r.bool()?,
                        region_size: r.u64()?,
                        path: r.str()?,
                    });
                }
                Reply::ClusterInfo {
                    node,
                    coherent,
                    simulated,
                    nodes,
                }
            }
            other => {
                return Err(ShoalError::protocol(format!(
                    "unknown reply opcode {other:#06x}"
                )))
            }
        };
        r.finish()?;
        Ok(reply)
    }
}

fn encode_name_entry(w: &mut Writer, e: &NameEntry) {
    w.id(&e.id)
        .u64(e.data_size)
        .u32(e.meta_size)
        .u64(e.mtime_ms)
        .str(&e.name);
}

fn decode_name_entry(r: &mut Reader<'_>) -> Result<NameEntry> {
    Ok(NameEntry {
        id: r.id()?,
        data_size: r.u64()?,
        meta_size: r.u32()?,
        mtime_ms: r.u64()?,
        name: r.str()?,
    })
}

fn durability(level: u8) -> Result<Durability> {
    Durability::from_u8(level)
        .ok_or_else(|| ShoalError::protocol(format!("unknown durability {level}")))
}

/// Decodes one request from the front of `bytes`: `Ok(None)` if more bytes
/// are needed, otherwise the request and how many bytes it used. Used by the
/// daemon's connection reader and by the fuzz target.
pub fn decode_request(bytes: &[u8]) -> Result<Option<(Request, usize)>> {
    let Some(header) = FrameHeader::parse(bytes)? else {
        return Ok(None);
    };
    let end = FRAME_HEADER_LEN + header.len as usize;
    if bytes.len() < end {
        return Ok(None);
    }
    Ok(Some((
        Request::decode(header, &bytes[FRAME_HEADER_LEN..end])?,
        end,
    )))
}

#[cfg(test)]
mod doc_check;
#[cfg(test)]
mod tests;
