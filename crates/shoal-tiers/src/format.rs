//! The byte layout of an object on a tier: a 64-byte header, then the
//! payload (data followed by metadata, exactly as in memory). Every backend
//! stores this same image, so one decoder checks them all.
//!
//! ```text
//! offset size  field
//!      0    8  magic "SHOALOBJ"
//!      8    4  format version (1), little-endian like every integer here
//!     12   20  object id
//!     32    8  data size
//!     40    4  metadata size
//!     44    4  crc32c of the payload
//!     48   12  reserved, zero
//!     60    4  crc32c of bytes 0..60 (the header itself)
//! ```
//!
//! Checksum: CRC-32C. It runs at memory speed with the SSE4.2 / ARMv8 CRC
//! instructions (the `crc32c` crate picks them at run time), catches every
//! burst error up to 32 bits and any odd number of flipped bits, and misses
//! random corruption with probability 2^-32: the faults here are accidents
//! (torn writes, media errors, truncation), not an adversary, so a
//! cryptographic hash would only cost bandwidth. The header has its own CRC so
//! a flipped size or id is caught before a single payload byte is trusted.

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::{ObjectId, ID_LEN};

/// The first 8 bytes of every image: a file or key of other bytes is
/// refused (`ObjectCorrupt`) before anything in it is trusted.
pub const MAGIC: [u8; 8] = *b"SHOALOBJ";
/// The image format this build writes and reads. An image of another
/// version is `VersionMismatch`, not `ObjectCorrupt`: it may be intact.
pub const VERSION: u32 = 1;
/// Bytes of the header: the payload starts at this offset in its image, so
/// never at a page boundary of the file (why direct I/O goes through a
/// bounce buffer).
pub const HEADER_LEN: usize = 64;

/// The header of a stored object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectHeader {
    /// The object the image holds. Readers check it against the id they
    /// asked for: another object's bytes under this name are `ObjectCorrupt`.
    pub id: ObjectId,
    /// Bytes of data: the payload's first section.
    pub data_size: u64,
    /// Bytes of metadata, right after the data.
    pub meta_size: u32,
    /// CRC-32C of the payload (data then metadata).
    pub checksum: u32,
}

impl ObjectHeader {
    /// Bytes of data and metadata.
    pub fn payload_len(&self) -> u64 {
        self.data_size + u64::from(self.meta_size)
    }

    /// Bytes of the whole image on the tier.
    pub fn stored_len(&self) -> u64 {
        HEADER_LEN as u64 + self.payload_len()
    }

    /// The header's bytes (layout above), its own CRC-32C in the last four.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&VERSION.to_le_bytes());
        out[12..32].copy_from_slice(self.id.as_bytes());
        out[32..40].copy_from_slice(&self.data_size.to_le_bytes());
        out[40..44].copy_from_slice(&self.meta_size.to_le_bytes());
        out[44..48].copy_from_slice(&self.checksum.to_le_bytes());
        let crc = crc32c::crc32c(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and checks a header. `what` names the file or key in errors.
    /// A damaged header is `ObjectCorrupt`, like a damaged payload.
    pub fn decode(bytes: &[u8], what: &str) -> Result<Self> {
        let corrupt =
            |why: &str| ShoalError::new(ErrorKind::ObjectCorrupt, format!("{what}: {why}"));
        if bytes.len() < HEADER_LEN {
            return Err(corrupt(&format!(
                "truncated header ({} of {HEADER_LEN} bytes)",
                bytes.len()
            )));
        }
        let bytes = &bytes[..HEADER_LEN];
        if bytes[0..8] != MAGIC {
            return Err(corrupt("not a shoal object (bad magic)"));
        }
        let stored_crc = u32::from_le_bytes(bytes[60..64].try_into().expect("4 bytes"));
        if crc32c::crc32c(&bytes[..60]) != stored_crc {
            return Err(corrupt("header checksum mismatch"));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(ShoalError::new(
                ErrorKind::VersionMismatch,
                format!("{what}: object format version {version}, this build reads {VERSION}"),
            ));
        }
        let id = ObjectId::from_slice(&bytes[12..12 + ID_LEN]).expect("20 bytes");
        let header = Self {
            id,
            data_size: u64::from_le_bytes(bytes[32..40].try_into().expect("8 bytes")),
            meta_size: u32::from_le_bytes(bytes[40..44].try_into().expect("4 bytes")),
            checksum: u32::from_le_bytes(bytes[44..48].try_into().expect("4 bytes")),
        };
        if header
            .data_size
            .checked_add(u64::from(header.meta_size))
            .is_none()
        {
            return Err(corrupt("sizes overflow"));
        }
        Ok(header)
    }
}

/// Sizes of an object's two sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectSizes {
    /// Bytes of data: the payload's first section.
    pub data_size: u64,
    /// Bytes of metadata, right after the data.
    pub meta_size: u32,
}

impl ObjectSizes {
    /// Bytes of data and metadata. Saturates instead of wrapping, so
    /// impossible sizes fail the capacity check (`ObjectHeader::decode`
    /// refuses them as corrupt).
    pub fn payload_len(&self) -> u64 {
        self.data_size.saturating_add(u64::from(self.meta_size))
    }

    /// Bytes of the whole image on a tier (header included).
    pub fn stored_len(&self) -> u64 {
        (HEADER_LEN as u64).saturating_add(self.payload_len())
    }
}

/// Refuses a restore of object `id` (a payload of `payload_len` bytes) into
/// a destination of `dst_len` bytes.
pub fn check_destination(id: &ObjectId, dst_len: u64, payload_len: u64) -> Result<()> {
    if dst_len == payload_len {
        return Ok(());
    }
    Err(ShoalError::invalid(format!(
        "object {id}: destination of {dst_len} bytes for a {payload_len}-byte object"
    )))
}

/// The error for a payload whose checksum does not match its header.
pub fn checksum_mismatch(what: &str, expected: u32, found: u32) -> ShoalError {
    ShoalError::new(
        ErrorKind::ObjectCorrupt,
        format!(
            "{what}: payload checksum mismatch (stored {expected:#010x}, computed {found:#010x})"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> ObjectHeader {
        ObjectHeader {
            id: ObjectId::random(),
            data_size: 1 << 33,
            meta_size: 17,
            checksum: 0xdead_beef,
        }
    }

    #[test]
    fn round_trips() {
        let h = header();
        assert_eq!(ObjectHeader::decode(&h.encode(), "x").unwrap(), h);
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let bytes = header().encode();
        for bit in 0..HEADER_LEN * 8 {
            let mut damaged = bytes;
            damaged[bit / 8] ^= 1 << (bit % 8);
            let err = ObjectHeader::decode(&damaged, "x").unwrap_err();
            assert_eq!(err.kind(), ErrorKind::ObjectCorrupt, "bit {bit}: {err}");
        }
    }

    #[test]
    fn truncated_header_is_corrupt() {
        let bytes = header().encode();
        let err = ObjectHeader::decode(&bytes[..HEADER_LEN - 1], "x").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectCorrupt);
    }
}
