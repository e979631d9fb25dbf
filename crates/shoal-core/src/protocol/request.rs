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
