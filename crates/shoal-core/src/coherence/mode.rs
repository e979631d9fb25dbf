//! Whether the fabric between nodes keeps caches coherent.

use std::fmt;
use std::str::FromStr;

use crate::error::ShoalError;

/// Whether the memory fabric keeps the nodes' caches coherent.
///
/// Chosen per cluster in its configuration; spelled `coherent` or
/// `noncoherent` there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CoherenceMode {
    /// The hardware keeps caches coherent (one host, a CXL mode with
    /// back-invalidation, an SMP system). No flush or invalidate is issued.
    #[default]
    Coherent,
    /// Caches of different nodes are not kept coherent (ThymesisFlow, some CXL
    /// sharing modes): writers flush before seal, readers invalidate before
    /// their first read. See the [module docs](super) for the protocol.
    Noncoherent,
}

impl CoherenceMode {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Coherent => "coherent",
            Self::Noncoherent => "noncoherent",
        }
    }

    /// True when writers must flush and readers must invalidate.
    pub fn needs_maintenance(self) -> bool {
        self == Self::Noncoherent
    }
}

impl fmt::Display for CoherenceMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CoherenceMode {
    type Err = ShoalError;

    /// Parses `coherent` or `noncoherent`, ignoring ASCII case and surrounding
    /// whitespace (`non-coherent` is accepted too, as people write it).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("coherent") {
            Ok(Self::Coherent)
        } else if s.eq_ignore_ascii_case("noncoherent") || s.eq_ignore_ascii_case("non-coherent") {
            Ok(Self::Noncoherent)
        } else {
            Err(ShoalError::invalid(format!(
                "unknown coherence mode {s:?}: expected \"coherent\" or \"noncoherent\""
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn display_and_parse_round_trip() {
        for mode in [CoherenceMode::Coherent, CoherenceMode::Noncoherent] {
            assert_eq!(mode.to_string().parse::<CoherenceMode>().unwrap(), mode);
        }
        assert_eq!(CoherenceMode::Coherent.to_string(), "coherent");
        assert_eq!(CoherenceMode::Noncoherent.to_string(), "noncoherent");
    }

    #[test]
    fn parse_is_lenient_about_case_and_hyphen() {
        assert_eq!(
            " NonCoherent ".parse::<CoherenceMode>().unwrap(),
            CoherenceMode::Noncoherent
        );
        assert_eq!(
            "non-coherent".parse::<CoherenceMode>().unwrap(),
            CoherenceMode::Noncoherent
        );
        assert_eq!(
            "COHERENT".parse::<CoherenceMode>().unwrap(),
            CoherenceMode::Coherent
        );
    }

    #[test]
    fn parse_rejects_other_words() {
        let err = "incoherent".parse::<CoherenceMode>().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.message().contains("incoherent"));
        assert!("".parse::<CoherenceMode>().is_err());
    }

    #[test]
    fn only_noncoherent_needs_maintenance() {
        assert!(!CoherenceMode::Coherent.needs_maintenance());
        assert!(CoherenceMode::Noncoherent.needs_maintenance());
        assert_eq!(CoherenceMode::default(), CoherenceMode::Coherent);
    }
}
