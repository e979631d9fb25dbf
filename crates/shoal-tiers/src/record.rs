//! What the manifest knows about one object: sizes, checksum, which tiers
//! hold a verified copy, the durability it was sealed with.

use std::fmt;

use shoal_core::error::{Result, ShoalError};

use crate::format::ObjectSizes;

/// A tier below memory, nearest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum TierLevel {
    /// The node's burst buffer (local, fast).
    Burst = 0,
    /// The backing store (shared file system or object store).
    Backing = 1,
}

impl TierLevel {
    /// Every level, nearest first: the order a restore tries them in.
    pub const ALL: [TierLevel; 2] = [TierLevel::Burst, TierLevel::Backing];

    /// The level's name (its `Display` too) in logs and errors: `burst` or
    /// `backing`.
    pub fn name(self) -> &'static str {
        match self {
            TierLevel::Burst => "burst",
            TierLevel::Backing => "backing",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for TierLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The tiers that hold a complete, durable copy of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct TierSet(u8);

impl TierSet {
    /// No tier: an object in memory only (dirty). A record never keeps it:
    /// a record left with no copy is removed.
    pub const EMPTY: TierSet = TierSet(0);

    /// `level` alone.
    pub fn of(level: TierLevel) -> Self {
        TierSet(level.bit())
    }

    /// Whether `level` holds a copy.
    pub fn contains(self, level: TierLevel) -> bool {
        self.0 & level.bit() != 0
    }

    /// This set and `level` (a copy written).
    pub fn with(self, level: TierLevel) -> Self {
        TierSet(self.0 | level.bit())
    }

    /// This set but `level` (a copy evicted, lost or found corrupt).
    pub fn without(self, level: TierLevel) -> Self {
        TierSet(self.0 & !level.bit())
    }

    /// Whether no tier holds a copy.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Nearest first.
    pub fn iter(self) -> impl Iterator<Item = TierLevel> {
        TierLevel::ALL
            .into_iter()
            .filter(move |l| self.contains(*l))
    }
}

pub use shoal_core::durability::Durability;

impl TierSet {
    /// Whether an object whose copies are on these tiers meets `level`.
    pub fn meets(self, level: Durability) -> bool {
        match level {
            Durability::Memory => true,
            Durability::Local => !self.is_empty(),
            Durability::Backing => self.contains(TierLevel::Backing),
        }
    }

    /// The bits as `shoal ls` and the wire carry them (bit 0 burst buffer,
    /// bit 1 backing store).
    pub fn bits(self) -> u8 {
        self.0
    }
}

/// The manifest's record of one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRecord {
    /// Bytes of data and of metadata, as in every copy's header; a restore
    /// needs a destination of exactly their sum.
    pub sizes: ObjectSizes,
    /// CRC-32C of the payload, as in every copy's header.
    pub checksum: u32,
    /// Tiers holding a complete, durable copy.
    pub tiers: TierSet,
    /// The durability the object was sealed with (`Memory` for files adopted
    /// by recovery: no promise was made for them).
    pub durability: Durability,
    /// Seal time, milliseconds since the Unix epoch: of two records naming
    /// one file after a crash, the later seal is the file's version.
    pub sealed_at_ms: u64,
    /// The modification time its name shows, ms since the epoch: the seal
    /// time, or one set since (utimens on the mount, `SetMtime`).
    pub modified_ms: u64,
    /// An optional path-like name (for the POSIX view).
    pub name: Option<String>,
    /// Which incarnation of the id this is (ids may be created again after a
    /// delete): issued by the engine, increasing over the node's life
    /// (restarts included). A delete of generation `g` ends every record of
    /// a generation up to `g`, and none of them is written after it
    /// (docs/tiers.md, "Deletes are final"). 0 for records written before
    /// generations existed.
    pub generation: u64,
}

/// Version 1: without `generation`; version 2: without `modified_ms`;
/// both still read.
const RECORD_VERSION: u8 = 3;
const V1_FIXED_LEN: usize = 1 + 8 + 4 + 4 + 1 + 1 + 8 + 4;
const V2_FIXED_LEN: usize = V1_FIXED_LEN + 8;
const FIXED_LEN: usize = V2_FIXED_LEN + 8;

impl ObjectRecord {
    /// The record's bytes in the manifest (little-endian, versioned):
    /// version u8, data u64, meta u32, checksum u32, tiers u8, durability u8,
    /// sealed_at_ms u64, generation u64, modified_ms u64, name length u32
    /// (u32::MAX = no name), name bytes. (Version 1 had no generation,
    /// version 2 no modified_ms.)
    pub fn encode(&self) -> Vec<u8> {
        let name = self.name.as_deref().map(str::as_bytes);
        let mut out = Vec::with_capacity(FIXED_LEN + name.map_or(0, <[u8]>::len));
        out.push(RECORD_VERSION);
        out.extend_from_slice(&self.sizes.data_size.to_le_bytes());
        out.extend_from_slice(&self.sizes.meta_size.to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
        out.push(self.tiers.0);
        out.push(self.durability as u8);
        out.extend_from_slice(&self.sealed_at_ms.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.modified_ms.to_le_bytes());
        match name {
            Some(name) => {
                out.extend_from_slice(&(name.len() as u32).to_le_bytes());
                out.extend_from_slice(name);
            }
            None => out.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
        out
    }

    /// Reads a record of any version `encode` has written (1 to 3): version
    /// 1 reads as generation 0, versions 1 and 2 as modified at the seal. An
    /// unknown version, a truncated record, an unknown durability or a name
    /// that is not UTF-8 is `Protocol`: the manifest is damaged, not the
    /// object.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = |why: &str| ShoalError::protocol(format!("manifest record: {why}"));
        let fixed = match bytes.first() {
            Some(1) => V1_FIXED_LEN,
            Some(2) => V2_FIXED_LEN,
            Some(&RECORD_VERSION) => FIXED_LEN,
            Some(v) => return Err(bad(&format!("version {v}"))),
            None => return Err(bad("truncated")),
        };
        if bytes.len() < fixed {
            return Err(bad("truncated"));
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let generation = if fixed >= V2_FIXED_LEN { u64_at(27) } else { 0 };
        let sealed_at_ms = u64_at(19);
        let modified_ms = if fixed == FIXED_LEN {
            u64_at(35)
        } else {
            sealed_at_ms
        };
        let name_len = u32_at(fixed - 4);
        let name = if name_len == u32::MAX {
            None
        } else {
            let raw = bytes
                .get(fixed..fixed + name_len as usize)
                .ok_or_else(|| bad("truncated name"))?;
            Some(String::from_utf8(raw.to_vec()).map_err(|_| bad("name is not UTF-8"))?)
        };
        Ok(Self {
            sizes: ObjectSizes {
                data_size: u64_at(1),
                meta_size: u32_at(9),
            },
            checksum: u32_at(13),
            tiers: TierSet(bytes[17]),
            durability: Durability::from_u8(bytes[18]).ok_or_else(|| bad("durability"))?,
            sealed_at_ms,
            modified_ms,
            name,
            generation,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        for name in [None, Some(String::new()), Some("a/b/c.arrow".to_string())] {
            let record = ObjectRecord {
                sizes: ObjectSizes {
                    data_size: 1 << 40,
                    meta_size: 7,
                },
                checksum: 0x1234_5678,
                tiers: TierSet::of(TierLevel::Backing).with(TierLevel::Burst),
                durability: Durability::Local,
                sealed_at_ms: 1_700_000_000_000,
                modified_ms: 946_684_800_000,
                name,
                generation: 77,
            };
            let bytes = record.encode();
            assert_eq!(ObjectRecord::decode(&bytes).unwrap(), record.clone());
            // The same record as version 2 wrote it: modified at the seal.
            let mut v2 = bytes[..35].to_vec();
            v2[0] = 2;
            v2.extend_from_slice(&bytes[43..]);
            let old = ObjectRecord::decode(&v2).unwrap();
            let sealed = ObjectRecord {
                modified_ms: record.sealed_at_ms,
                ..record.clone()
            };
            assert_eq!(old, sealed.clone());
            // As version 1 wrote it: generation 0 as well.
            let mut v1 = bytes[..27].to_vec();
            v1[0] = 1;
            v1.extend_from_slice(&bytes[43..]);
            let old = ObjectRecord::decode(&v1).unwrap();
            assert_eq!(
                old,
                ObjectRecord {
                    generation: 0,
                    ..sealed
                }
            );
        }
        assert!(ObjectRecord::decode(&[1, 2, 3]).is_err());
        assert!(ObjectRecord::decode(&[]).is_err());
    }

    #[test]
    fn durability_is_met_by_the_right_tiers() {
        let burst = TierSet::of(TierLevel::Burst);
        let backing = TierSet::of(TierLevel::Backing);
        assert!(TierSet::EMPTY.meets(Durability::Memory));
        assert!(!TierSet::EMPTY.meets(Durability::Local));
        assert!(burst.meets(Durability::Local) && backing.meets(Durability::Local));
        assert!(!burst.meets(Durability::Backing) && backing.meets(Durability::Backing));
        assert_eq!(
            burst.with(TierLevel::Backing).iter().collect::<Vec<_>>(),
            TierLevel::ALL
        );
        assert_eq!("local".parse::<Durability>().unwrap(), Durability::Local);
        assert!("disk".parse::<Durability>().is_err());
    }
}
