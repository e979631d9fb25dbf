//! What a daemon answers, and its encoding.

use crate::error::{ErrorKind, Result, ShoalError};
use crate::event::ObjectEvent;
use crate::location::ObjectLocation;

use super::capacity_report::CapacityReport;
use super::codec::{Reader, Writer};
use super::frame::FrameHeader;
use super::located::Located;
use super::name_entry::{decode_name_entry, encode_name_entry, NameEntry};
use super::opcodes::op;
use super::peer_region::PeerRegion;
use super::store_report::{ObjectInfo, StoreStats, POLICY_NAMES};
use super::tier_report::TierReport;

/// What the daemon answers: one frame per request (none for `Release`), opcodes 0x0080 up
/// (docs/protocol.md §3); on a subscribed connection, notifications only.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Success with nothing to say (`Seal`, `Abort`, `Subscribe`, the names' changes): an
    /// empty payload.
    Ok,
    /// The request failed; nothing else is said. (A malformed request gets no reply at
    /// all: the daemon drops the connection.)
    Error {
        /// What went wrong; a code the decoder does not know is a protocol error.
        kind: ErrorKind,
        /// The context, for people (id, sizes, path).
        message: String,
    },
    /// Sent with the region's fd attached.
    Welcome {
        /// The daemon's [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION).
        version: u32,
        /// This connection's id, unique while it is connected; never 0.
        client_id: u32,
        /// Bytes to map from offset 0 of the fd; every offset sent later is below it.
        region_size: u64,
        /// Bytes the store may use, at connect time (an elastic store's moves later).
        capacity: u64,
        /// The unit objects are aligned and padded to, in bytes (a power of two: 64 by
        /// default, at least `coherence::LINE` on a non-coherent cluster).
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
        /// The generation of that node's region: a client whose mapping of it shows
        /// another maps the file anew, or fails if the node restarted meanwhile.
        generation: u64,
        /// Where each object's block starts in that region, in request order (sizes are
        /// the request's); the data comes first, the metadata right after it.
        offsets: Vec<u64>,
    },
    /// `CreateOn` a node whose memory cannot be mapped here: the objects
    /// are allocated on that node, and the client writes them at these
    /// offsets of its own node's region (staging buffers); their seal
    /// pushes the bytes to that node.
    Staged {
        /// Each object's staging buffer in this daemon's own region, in request order.
        offsets: Vec<u64>,
    },
    /// The answer to `Get`, also when ids were not found in time.
    Objects {
        /// One entry per requested id, in request order: `None` not found (no reference
        /// taken), else where it is (one reference taken for this connection).
        objects: Vec<Option<Located>>,
    },
    /// A yes or no: `Contains`, `Resize` (false: no room to grow in place).
    Bool(bool),
    /// The answer to `List`.
    List {
        /// Every object but the delete-pending ones, in no particular order: those in
        /// memory, then those only on a tier.
        objects: Vec<ObjectInfo>,
    },
    /// The answer to `Stats`: the store's counters.
    Stats(StoreStats),
    /// The answer to `Tiers`: the tiers below memory and the drain's progress.
    Tiers(TierReport),
    /// The answer to `Resolve`: the name and the object it is bound to.
    Named(NameEntry),
    /// The answer to `ListNames`.
    Names {
        /// Every name under the directory asked for, recursively, sorted by bytes.
        entries: Vec<NameEntry>,
    },
    /// The answer to `Capacity`: the capacity controller's state and trace.
    Capacity(CapacityReport),
    /// On a subscribed connection: an object sealed or removed (never
    /// `Aborted`: subscribers see sealed objects only).
    Notification(ObjectEvent),
    /// One status per id: `None` for success.
    Statuses {
        /// In request order: `None` (0 on the wire) for success, else the error's kind.
        errors: Vec<Option<ErrorKind>>,
    },
    /// The answer to `Evict`.
    Evicted {
        /// Bytes actually freed (block lengths, padding included); may exceed the request.
        bytes: u64,
    },
    /// Sent with two fds attached: the object index (map it read-only) and
    /// this client's reference table of `slots` u32 counts.
    FastReads {
        /// The index's slot count (a power of two; the index's header says it too).
        slots: u32,
    },
    /// Sent with two fds attached: this client's write channel (`records`
    /// records in its ring) and the daemon's doorbell.
    FastWrites {
        /// Records in the channel's ring (`fast_path::writes::RECORDS`, 256).
        records: u32,
    },
    /// A block of the region lent to this client as lease number `lease`
    /// (`len` 0: none).
    Lent {
        /// The lease's number, unique in the store's life: what a `GiveBack` record names.
        lease: u64,
        /// Where the block starts in the region (a multiple of the line size).
        offset: u64,
        /// The block's length in bytes, whole lines; 0: nothing lent now (create through
        /// `Create`).
        len: u64,
    },
    /// Sent with two fds per entry attached (the owner's index, then this
    /// client's table there): per owner node, its incarnation (its region's
    /// generation).
    PeerReads {
        /// `(node, generation)` per owner, in the order of the fds; at most 32.
        owners: Vec<(u32, u64)>,
    },
    /// `node` is this daemon's id; `coherent` false means clients flush
    /// before seal and invalidate before the first read of remote objects
    /// (and of local ones marked `Located::invalidate`).
    ClusterInfo {
        /// This daemon's node id.
        node: u32,
        /// Whether the fabric keeps caches coherent (`false`: flush and invalidate).
        coherent: bool,
        /// Emulation only: clients keep a private copy of every region as
        /// their "cache", synchronised only by flush and invalidate, so the
        /// coherency protocol is exercised on one host.
        simulated: bool,
        /// The cluster's identity (its name and a digest of its token): equal
        /// for clients of nodes of one cluster, different for any other.
        cluster: String,
        /// How traffic between this node and its peers is protected:
        /// `none (every node on loopback)`, `none: insecure_cleartext`, or
        /// `tls1.3, data channel tls-userspace` (`tls-kernel` with kTLS).
        encryption: String,
        /// Every node of the cluster, this one included, as seen from this host.
        nodes: Vec<PeerRegion>,
    },
}

/// The first byte of an `Objects` entry.
mod entry {
    pub const ABSENT: u8 = 0;
    pub const FOUND: u8 = 1;
    /// Found, and the reader must invalidate it first (`Located::invalidate`).
    pub const FOUND_INVALIDATE: u8 = 2;
}

impl Reply {
    /// The `Error` reply for `err`: its kind and message.
    pub fn error(err: &ShoalError) -> Self {
        Reply::Error {
            kind: err.kind(),
            message: err.message().to_owned(),
        }
    }

    /// Appends the whole frame (header + payload) to `out`. Counts are not checked
    /// against [`MAX_FRAME_LEN`](super::MAX_FRAME_LEN): the client's decoder refuses an
    /// oversized reply.
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
                    ObjectEvent::Sealed {
                        id,
                        data_size,
                        meta_size,
                    } => w.u8(1).id(id).u64(*data_size).u32(*meta_size),
                    ObjectEvent::Removed { id, deleted } => {
                        w.u8(if *deleted { 3 } else { 2 }).id(id).u64(0).u32(0)
                    }
                    ObjectEvent::Aborted { id } => w.u8(4).id(id).u64(0).u32(0),
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
                cluster,
                encryption,
                nodes,
            } => {
                w.u32(*node)
                    .u8(u8::from(*coherent))
                    .u8(u8::from(*simulated))
                    .str(cluster)
                    .str(encryption)
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

    /// Decodes one reply's payload (`header` already parsed). What the wire does not
    /// carry is left out: a not-found `Objects` entry's location, a `Removed`
    /// notification's sizes; a `Stats` policy name not in [`POLICY_NAMES`] becomes `other`.
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
                    1 => ObjectEvent::Sealed {
                        id,
                        data_size,
                        meta_size,
                    },
                    2 => ObjectEvent::Removed { id, deleted: false },
                    3 => ObjectEvent::Removed { id, deleted: true },
                    4 => ObjectEvent::Aborted { id },
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
                let cluster = r.str()?;
                let encryption = r.str()?;
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
                    cluster,
                    encryption,
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
