//! Object ids: 20 opaque bytes, unique cluster-wide (as in Plasma); and the
//! number a daemon gives each connected client.

use std::fmt;

/// Bytes in an object id, on the wire and in the fast path's index (there zero-padded to 24).
pub const ID_LEN: usize = 20;

/// A 20-byte object id. Callers choose ids (a content hash, a task id) or draw
/// random ones with [`ObjectId::random`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ObjectId(pub [u8; ID_LEN]);

impl ObjectId {
    /// The id in `bytes`; `None` unless they are exactly [`ID_LEN`] long.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(ObjectId)
    }

    /// A random id from the operating system's generator.
    pub fn random() -> Self {
        let mut bytes = [0u8; ID_LEN];
        getrandom::fill(&mut bytes).expect("the OS random generator is available");
        ObjectId(bytes)
    }

    /// The id's 20 raw bytes, as they go on the wire.
    pub fn as_bytes(&self) -> &[u8; ID_LEN] {
        &self.0
    }

    /// The id as 40 lower-case hex digits: how logs, the CLI and names of tier files show it.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The id written as 40 hex digits (either case), as [`ObjectId::to_hex`] writes it; `None`
    /// for any other length or character. `u8::from_str_radix` alone takes a sign ("+f" is
    /// 0x0f): a tier walking its files would take a name `+f…` for the id whose file is `0f…`.
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 2 * ID_LEN || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut bytes = [0u8; ID_LEN];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(ObjectId(bytes))
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({})", self.to_hex())
    }
}

/// A client of one daemon: the number its connection gets, unique while it
/// is connected; the fast path's reference tables are kept by it.
pub type ClientId = u32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trip() {
        let id = ObjectId::random();
        assert_eq!(ObjectId::from_hex(&id.to_hex()), Some(id));
        assert_eq!(ObjectId::from_hex("zz"), None);
        assert_eq!(ObjectId::from_hex(&"g".repeat(40)), None);
        assert_ne!(ObjectId::random(), ObjectId::random());
    }

    #[test]
    fn from_hex_takes_exactly_hex_digits() {
        let zeros = "0".repeat(38);
        assert_eq!(
            ObjectId::from_hex(&format!("0f{zeros}")).unwrap().0[0],
            0x0f
        );
        assert_eq!(
            ObjectId::from_hex(&"Ab".repeat(20)).unwrap().0,
            [0xab; ID_LEN]
        );
        for pair in ["+f", "-0", "+0", " f", "f ", "0x"] {
            assert_eq!(
                ObjectId::from_hex(&format!("{pair}{zeros}")),
                None,
                "{pair}"
            );
            assert_eq!(
                ObjectId::from_hex(&format!("{zeros}{pair}")),
                None,
                "{pair}"
            );
        }
    }
}
