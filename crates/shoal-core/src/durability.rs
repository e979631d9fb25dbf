//! Durability levels: when a seal is acknowledged, and so what survives a
//! crash (docs/tiers.md "Durability levels"). On the wire as one byte.

use std::fmt;
use std::str::FromStr;

use crate::error::{Result, ShoalError};

/// When a seal is acknowledged; ordered from the weakest (`Memory`) to the strongest
/// (`Backing`). The discriminant is the wire byte (`Seal`, `WaitDurable`, `Tiers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(u8)]
pub enum Durability {
    /// Acknowledged in memory: lost with the daemon unless a drain completed.
    #[default]
    Memory = 0,
    /// Acknowledged once fsync'ed on the burst buffer and in the manifest.
    Local = 1,
    /// Acknowledged once in the backing store and in the manifest.
    Backing = 2,
}

impl Durability {
    /// Every level, weakest first.
    pub const ALL: [Durability; 3] = [Durability::Memory, Durability::Local, Durability::Backing];

    /// The level's name in configuration, flags and the Python API: `memory`, `local`, `backing`.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Memory => "memory",
            Durability::Local => "local",
            Durability::Backing => "backing",
        }
    }

    /// The level whose wire byte is `v`; `None` for any other byte (no default byte here:
    /// `Seal`'s 0xFF is decoded by the protocol).
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|d| *d as u8 == v)
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Durability {
    type Err = ShoalError;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| {
                ShoalError::invalid(format!(
                    "durability {s:?}: expected memory, local or backing"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_bytes_round_trip() {
        for d in Durability::ALL {
            assert_eq!(d.name().parse::<Durability>().unwrap(), d);
            assert_eq!(Durability::from_u8(d as u8), Some(d));
        }
        assert!("disk".parse::<Durability>().is_err());
        assert_eq!(Durability::from_u8(3), None);
        assert!(Durability::Memory < Durability::Local && Durability::Local < Durability::Backing);
    }
}
