//! Little-endian field readers and writers with typed errors.

use super::frame::FRAME_HEADER_LEN;
use crate::error::{Result, ShoalError};
use crate::ids::{ObjectId, ID_LEN};

/// Reads fields from a payload; every short read is a protocol error.
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`: one frame's payload, header excluded.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                ShoalError::protocol(format!(
                    "truncated payload: needed {n} bytes at offset {}, have {}",
                    self.at,
                    self.bytes.len()
                ))
            })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("length checked"))
    }

    /// One byte.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    /// One byte, 0 or 1; any other byte is a protocol error.
    pub fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(ShoalError::protocol(format!(
                "invalid boolean byte {other}"
            ))),
        }
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> Result<u16> {
        self.array().map(u16::from_le_bytes)
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> Result<u32> {
        self.array().map(u32::from_le_bytes)
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// A little-endian `i64` (timeouts: negative waits forever).
    pub fn i64(&mut self) -> Result<i64> {
        self.array().map(i64::from_le_bytes)
    }

    /// An object id: 20 raw bytes, no length prefix.
    pub fn id(&mut self) -> Result<ObjectId> {
        self.array::<ID_LEN>().map(ObjectId)
    }

    /// A `u32` element count, checked against the bytes left so a forged
    /// count cannot make the decoder allocate more than the frame holds.
    pub fn count(&mut self, element_len: usize) -> Result<usize> {
        let n = self.u32()? as usize;
        let left = self.bytes.len() - self.at;
        if n.checked_mul(element_len).is_none_or(|need| need > left) {
            return Err(ShoalError::protocol(format!(
                "count {n} of {element_len}-byte elements exceeds the {left} bytes left"
            )));
        }
        Ok(n)
    }

    /// A `u32` count, checked with 20-byte elements, then that many ids.
    pub fn ids(&mut self) -> Result<Vec<ObjectId>> {
        let n = self.count(ID_LEN)?;
        (0..n).map(|_| self.id()).collect()
    }

    /// A `u32` byte length, checked with 1-byte elements, then that many bytes of UTF-8 (no
    /// terminator); invalid UTF-8 is a protocol error.
    pub fn str(&mut self) -> Result<String> {
        let n = self.count(1)?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| ShoalError::protocol("string is not UTF-8"))
    }

    /// Fails if bytes are left over: every frame must be consumed exactly.
    pub fn finish(&self) -> Result<()> {
        if self.at != self.bytes.len() {
            return Err(ShoalError::protocol(format!(
                "{} trailing bytes in payload",
                self.bytes.len() - self.at
            )));
        }
        Ok(())
    }
}

/// Writes one frame: reserves the header, appends fields, patches the header.
pub struct Writer<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Writer<'a> {
    /// Starts a frame at the end of `out`: eight zero bytes for the header, which
    /// [`Writer::finish`] fills in (flags stay 0).
    pub fn frame(out: &'a mut Vec<u8>) -> Self {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
        Self { out, start }
    }

    /// Appends one byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }

    /// Appends a little-endian `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian `i64`.
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends an id's 20 raw bytes.
    pub fn id(&mut self, id: &ObjectId) -> &mut Self {
        self.out.extend_from_slice(&id.0);
        self
    }

    /// Appends a `u32` count, then the ids. The count is not checked against
    /// [`MAX_FRAME_LEN`](super::MAX_FRAME_LEN): callers split large batches.
    pub fn ids(&mut self, ids: &[ObjectId]) -> &mut Self {
        self.u32(ids.len() as u32);
        for id in ids {
            self.id(id);
        }
        self
    }

    /// Appends a `u32` byte length, then the string's UTF-8 bytes.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u32(s.len() as u32);
        self.out.extend_from_slice(s.as_bytes());
        self
    }

    /// Ends the frame: writes the payload's length and `opcode` into its header. The length is
    /// not checked against [`MAX_FRAME_LEN`](super::MAX_FRAME_LEN) (the receiver refuses an
    /// oversized frame).
    pub fn finish(self, opcode: u16) {
        let len = (self.out.len() - self.start - FRAME_HEADER_LEN) as u32;
        self.out[self.start..self.start + 4].copy_from_slice(&len.to_le_bytes());
        self.out[self.start + 4..self.start + 6].copy_from_slice(&opcode.to_le_bytes());
    }
}
