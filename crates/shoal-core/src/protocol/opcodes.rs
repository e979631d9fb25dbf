//! The opcodes of every request (below 0x80) and reply (0x80 and up), in
//! the frame header. doc_check.rs reads them from this file's `mod op`.

pub(super) mod op {
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
    pub const COOL: u16 = 0x1F;

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
