//! What a client asks its daemon, and its encoding.

use crate::durability::Durability;
use crate::error::{Result, ShoalError};
use crate::ids::ObjectId;

use super::codec::{Reader, Writer};
use super::create_spec::CreateSpec;
use super::frame::{FrameHeader, FRAME_HEADER_LEN};
use super::opcodes::op;

/// A timeout meaning "wait forever".
pub const WAIT_FOREVER: i64 = -1;

/// What a client asks its daemon: one frame each, opcodes 0x0001 up (docs/protocol.md §2).
/// The daemon answers each in order with one [`Reply`](super::Reply), except `Release`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// The first request of every connection; answered by `Welcome` with the region's fd,
    /// or `Error(VersionMismatch)`.
    Hello {
        /// The client's [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION): the daemon's must be
        /// the same.
        version: u32,
        /// The client's process id, for the daemon's logs only.
        pid: u32,
    },
    /// Create all or none; wait up to `timeout_ms` for space if the store is full.
    /// `growing`: the objects will grow through `Resize` (files being
    /// written): each is placed with free room after it where the store has
    /// some, not packed beside the last one created.
    Create {
        /// How long to wait for space on a full store, in ms from when the request is
        /// handled; 0 tries once. Running out is `StoreFull`, not `Timeout`.
        timeout_ms: u32,
        /// The objects, created in this order; answered by one offset each.
        objects: Vec<CreateSpec>,
        /// The objects will grow through `Resize`: placement only.
        growing: bool,
    },
    /// `durability`: acknowledged only once every object reached it
    /// (`None`: the node's default).
    Seal {
        /// Also drop the creator's reference once sealed, if the connection still holds it.
        release: bool,
        /// The level to reach before the `Ok`; on the wire 0 memory, 1 local, 2 backing,
        /// 0xFF (`None`) the node's default.
        durability: Option<Durability>,
        /// Unsealed objects this connection created, each once; all are checked before
        /// any is sealed.
        ids: Vec<ObjectId>,
    },
    /// Frees an unsealed object this connection created, at once.
    Abort {
        /// The object to drop.
        id: ObjectId,
    },
    /// Resizes an unsealed object this client created (socket-created, no
    /// metadata) to `data_size` data bytes in place: a shrink frees the
    /// block's tail, a growth takes the free space right after it.
    /// Answered by `Bool`: false when a growth found no room there (the
    /// object is unchanged; create a larger one instead).
    Resize {
        /// The object, created through `Create` by this connection.
        id: ObjectId,
        /// Its new size in bytes of data.
        data_size: u64,
    },
    /// Wait until every id is sealed or `timeout_ms` passes (-1: forever).
    Get {
        /// ms to wait from when the request is handled: negative waits forever
        /// ([`WAIT_FOREVER`] by convention), 0 looks once. Ids still missing then are
        /// answered not found, not `Timeout`.
        timeout_ms: i64,
        /// The objects, answered in this order; each one found takes a reference (an id
        /// listed twice takes two).
        ids: Vec<ObjectId>,
    },
    /// One-way: no reply.
    Release {
        /// One reference dropped per id; errors (unknown id, no reference) are ignored.
        ids: Vec<ObjectId>,
    },
    /// Deletes each id on its own (not all or nothing); answered by `Statuses`. A
    /// referenced object goes from view at once and is freed at its last release.
    Delete {
        /// The objects to delete.
        ids: Vec<ObjectId>,
    },
    /// Whether an object is sealed and not deleted, in memory or only on a tier; answered
    /// by `Bool`.
    Contains {
        /// The object asked about.
        id: ObjectId,
    },
    /// Every object but the delete-pending ones, sealed or not, in memory or only on a
    /// tier; answered by `List`.
    List,
    /// The store's counters; answered by `Stats`.
    Stats,
    /// Turns this connection into a stream of `Notification` replies.
    Subscribe,
    /// Evicts unreferenced sealed objects in the policy's order until at least `bytes`
    /// are freed or no candidate is left; answered by `Evicted`.
    Evict {
        /// Bytes to free (block lengths, padding included).
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
        /// How much the client would like; the daemon lends at most 1 MiB and 1/256 of its
        /// capacity, and nothing while it is short of free room.
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
        /// The node whose region holds the objects; this daemon's own node is a plain
        /// `Create`.
        node: u32,
        /// As `Create`'s: ms to wait for space, 0 tries once.
        timeout_ms: u32,
        /// The objects, in order (no `growing`: an object on another node is never
        /// resized).
        objects: Vec<CreateSpec>,
    },
    /// Waits until every id has a durable copy at `level` or `timeout_ms`
    /// passes (-1: forever); one status per id.
    WaitDurable {
        /// The level each object must reach; one the node has no tier for is answered
        /// `InvalidArgument`.
        level: Durability,
        /// ms to wait; -1 waits as long as it takes. An id not there in time is `Timeout`.
        timeout_ms: i64,
        /// The objects, answered in this order by `Statuses`.
        ids: Vec<ObjectId>,
    },
    /// Brings objects into memory from the tiers below (no reference taken).
    StageIn {
        /// The objects, answered in this order by `Statuses`.
        ids: Vec<ObjectId>,
    },
    /// Writes objects down to the lowest tier and frees their memory (unless
    /// referenced).
    StageOut {
        /// The objects, answered in this order by `Statuses` (`ObjectInUse` for one
        /// still referenced: written down, kept in memory).
        ids: Vec<ObjectId>,
    },
    /// Its readers are done with these objects for now: once unreferenced,
    /// each leaves memory before the eviction policy's own candidates (the
    /// most recently cooled first) until it is read again. A hint: nothing
    /// leaves memory because of it alone.
    Cool {
        /// The objects, answered in this order by `Statuses` (`ObjectNotFound`
        /// for one not sealed in this node's memory).
        ids: Vec<ObjectId>,
    },
    /// The node's tiers, their use and the drain's progress.
    Tiers,
    /// The elastic capacity controller's state; with `trace_since`, also
    /// its trace points later than that time (since the daemon started).
    Capacity {
        /// Since the daemon started, at µs resolution on the wire (`None` is -1: no trace);
        /// sent as at most `i64::MAX` µs.
        trace_since: Option<std::time::Duration>,
    },
    /// Gives object `id` the name `name`. On an object this client is still
    /// writing, the name is bound when it is sealed (and goes with it to the
    /// tiers); on a sealed object, at once. A name already bound moves to the
    /// new object and the old one is deleted (readers holding it keep it).
    Name {
        /// The object to name; unknown is `ObjectNotFound`.
        id: ObjectId,
        /// The name, checked by [`names::check`](crate::names::check): `InvalidArgument`
        /// or `NameTooLong` otherwise.
        name: String,
    },
    /// The object a name is bound to: `Named`.
    Resolve {
        /// The name to look up; unbound is `ObjectNotFound`.
        name: String,
    },
    /// Every name under directory `prefix` (`""`: all), sorted: `Names`.
    ListNames {
        /// The directory, without a trailing `/`; its names are listed recursively.
        prefix: String,
    },
    /// Moves a name, or every name under directory `from`, to `to`; a name
    /// bound at `to` is replaced (its object deleted).
    Rename {
        /// The name or directory that moves; nothing there is `ObjectNotFound`.
        from: String,
        /// Where it goes.
        to: String,
    },
    /// Removes a name and deletes its object.
    Unlink {
        /// The name to remove.
        name: String,
    },
    /// Sets the modification time a name shows (until its next binding).
    SetMtime {
        /// A name bound on this node (else `ObjectNotFound`).
        name: String,
        /// The time to show, ms since the epoch.
        mtime_ms: u64,
    },
}

/// No durability named: the node's default (the `Seal` byte).
const DURABILITY_DEFAULT: u8 = 0xFF;

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
            Request::Cool { ids } => {
                w.ids(ids);
                op::COOL
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
                // -1: no trace wanted. A time past i64::MAX µs (292,000 years)
                // saturates, which asks the same (no point is later); a
                // wrapping cast could have sent -1 or an earlier time.
                w.i64(trace_since.map_or(-1, |t| i64::try_from(t.as_micros()).unwrap_or(i64::MAX)));
                op::CAPACITY
            }
        };
        w.finish(opcode);
    }

    /// Decodes one request's payload (`header` already parsed). An unknown opcode, a
    /// truncated payload, a count larger than the payload, a bad bool, durability, trace
    /// time or UTF-8 string, or trailing bytes are a protocol error.
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
            op::COOL => Request::Cool { ids: r.ids()? },
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
