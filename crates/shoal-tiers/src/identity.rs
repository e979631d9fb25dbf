//! Which node of which cluster a tier (or manifest) belongs to.
//!
//! A tier directory is written and, at recovery, cleaned by exactly one node:
//! recovery deletes files it has no record of and cannot verify. Starting a
//! node on another node's directory (a copy-pasted config, a shared mount)
//! would have two daemons deleting each other's objects, so every tier
//! carries a marker naming its owner, and opening a tier whose marker names
//! someone else is refused.

use std::fmt;

use shoal_core::error::{ErrorKind, Result, ShoalError};

/// The owner of a tier: a cluster name and a node id (0 for a single node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierIdentity {
    /// The cluster's name (the daemon's `single-node` for a store on its
    /// own); written on one line, so it holds no line break.
    pub cluster: String,
    /// The node's id in its cluster; 0 for a single store.
    pub node: u32,
}

/// The marker's first line; also tells a human what the file is.
const FIRST_LINE: &str = "shoal tier identity v1";

impl TierIdentity {
    /// Node `node` of cluster `cluster`.
    pub fn new(cluster: impl Into<String>, node: u32) -> Self {
        Self {
            cluster: cluster.into(),
            node,
        }
    }

    /// The marker's text. The cluster name is written on one line, so names
    /// with line breaks are refused.
    pub fn encode(&self) -> Result<String> {
        if self.cluster.contains(['\n', '\r']) {
            return Err(ShoalError::invalid(format!(
                "cluster name {:?} contains a line break",
                self.cluster
            )));
        }
        Ok(format!(
            "{FIRST_LINE}\ncluster={}\nnode={}\n",
            self.cluster, self.node
        ))
    }

    /// Parses a marker `encode` wrote; `what` (the file or key read) names
    /// it in errors. Anything else is `InvalidArgument`: a tier with an
    /// unreadable marker is refused like another node's.
    pub fn decode(text: &str, what: &str) -> Result<Self> {
        let bad = || {
            ShoalError::new(
                ErrorKind::InvalidArgument,
                format!("{what}: not a shoal tier identity marker"),
            )
        };
        let mut lines = text.lines();
        if lines.next() != Some(FIRST_LINE) {
            return Err(bad());
        }
        let cluster = lines
            .next()
            .and_then(|l| l.strip_prefix("cluster="))
            .ok_or_else(bad)?;
        let node = lines
            .next()
            .and_then(|l| l.strip_prefix("node="))
            .and_then(|n| n.parse().ok())
            .ok_or_else(bad)?;
        Ok(Self::new(cluster, node))
    }

    /// `Ok` if `found` (read from the tier at `what`) is this identity.
    pub fn check(&self, found: &TierIdentity, what: &str) -> Result<()> {
        if found == self {
            return Ok(());
        }
        Err(ShoalError::new(
            ErrorKind::InvalidArgument,
            format!(
                "{what} belongs to {found}, not to {self}: refusing to use another node's tier \
                 (give this node its own directory or bucket prefix)"
            ),
        ))
    }
}

impl fmt::Display for TierIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} of cluster {:?}", self.node, self.cluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_others() {
        let me = TierIdentity::new("prod", 3);
        let text = me.encode().unwrap();
        assert_eq!(TierIdentity::decode(&text, "x").unwrap(), me);
        me.check(&me, "x").unwrap();
        let err = me.check(&TierIdentity::new("prod", 4), "dir").unwrap_err();
        assert!(err.message().contains("node 4"), "{err}");
        let err = me.check(&TierIdentity::new("test", 3), "dir").unwrap_err();
        assert!(err.message().contains("\"test\""), "{err}");
        assert!(TierIdentity::decode("garbage", "x").is_err());
        assert!(TierIdentity::new("a\nb", 0).encode().is_err());
    }
}
