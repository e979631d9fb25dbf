//! Frame header: `u32 payload length | u16 opcode | u16 flags (0)`, little-endian.

use crate::error::{Result, ShoalError};

/// Bytes of a frame header, before the payload.
pub const FRAME_HEADER_LEN: usize = 8;

/// Largest payload accepted (a get of ~3 million ids). Larger frames are a
/// protocol error: the daemon drops the client rather than buffer it.
pub const MAX_FRAME_LEN: u32 = 64 << 20;

/// A parsed frame header: flags are checked (0) and not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Bytes of payload that follow the header; at most [`MAX_FRAME_LEN`] (checked at parse).
    pub len: u32,
    /// What the payload is: a request's opcode (0x0001 up) or a reply's (0x0080 up), not
    /// checked here (an unknown one is refused once the payload is in).
    pub opcode: u16,
}

impl FrameHeader {
    /// Parses a header from the front of `bytes`; `Ok(None)` if fewer than
    /// eight bytes are there.
    pub fn parse(bytes: &[u8]) -> Result<Option<Self>> {
        let Some(head) = bytes.get(..FRAME_HEADER_LEN) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes"));
        let opcode = u16::from_le_bytes(head[4..6].try_into().expect("2 bytes"));
        let flags = u16::from_le_bytes(head[6..8].try_into().expect("2 bytes"));
        if len > MAX_FRAME_LEN {
            return Err(ShoalError::protocol(format!(
                "frame of {len} bytes exceeds the {MAX_FRAME_LEN}-byte limit"
            )));
        }
        if flags != 0 {
            return Err(ShoalError::protocol(format!(
                "unknown frame flags {flags:#06x}"
            )));
        }
        Ok(Some(Self { len, opcode }))
    }
}
