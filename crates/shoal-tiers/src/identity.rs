//! Which node of which cluster a tier (or manifest) belongs to.
//!
//! A tier directory is written and, at recovery, cleaned by exactly one node:
//! recovery deletes files it has no record of and cannot verify. Starting a
//! node on another node's directory (a copy-pasted config, a shared mount)
//! would have two daemons deleting each other's objects, so every tier
//! carries a marker naming its owner, and opening a tier whose marker names
//! someone else is refused.
//!
//! A backing store shared by the cluster outlives a node removed for good:
//! a survivor then *adopts* it (serves and deletes its objects). The marker
//! then also names the adopter, so the removed node, should it come back,
//! never writes there again, and no second survivor adopts it while the
//! first is a member ([`Adoption`]).

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
    /// The member serving this tier since `node` was removed from the
    /// cluster (`None`: `node` itself).
    pub adopted_by: Option<u32>,
}

/// What opening another node's tier for adoption finds in its marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adoption {
    /// The adopter named in the marker already: it opens the tier again
    /// (after its own restart).
    Ours,
    /// Nobody adopted it yet, or its adopter is no longer a member: the
    /// marker is rewritten to name the new adopter before anything else.
    TakeOver,
}

/// The marker's first line; also tells a human what the file is.
const FIRST_LINE: &str = "shoal tier identity v1";

impl TierIdentity {
    /// Node `node` of cluster `cluster`.
    pub fn new(cluster: impl Into<String>, node: u32) -> Self {
        Self {
            cluster: cluster.into(),
            node,
            adopted_by: None,
        }
    }

    /// Node `node`'s tier as `adopter` serves it.
    pub fn adopted(self, adopter: u32) -> Self {
        Self {
            adopted_by: Some(adopter),
            ..self
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
        let mut text = format!(
            "{FIRST_LINE}\ncluster={}\nnode={}\n",
            self.cluster, self.node
        );
        if let Some(adopter) = self.adopted_by {
            text.push_str(&format!("adopted_by={adopter}\n"));
        }
        Ok(text)
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
        let adopted_by = match lines.next() {
            None | Some("") => None,
            Some(line) => Some(
                line.strip_prefix("adopted_by=")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(bad)?,
            ),
        };
        Ok(Self {
            adopted_by,
            ..Self::new(cluster, node)
        })
    }

    /// `Ok` if `found` (read from the tier at `what`) is this identity.
    pub fn check(&self, found: &TierIdentity, what: &str) -> Result<()> {
        if found == self {
            return Ok(());
        }
        if let (None, Some(adopter)) = (self.adopted_by, found.adopted_by) {
            if found.cluster == self.cluster && found.node == self.node {
                return Err(ShoalError::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "{what} was adopted by node {adopter} after node {} was removed from \
                         the cluster: its objects are served by node {adopter} now, and this \
                         node never writes there again (start it with an empty backing store: \
                         a new directory or bucket prefix)",
                        self.node
                    ),
                ));
            }
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

impl TierIdentity {
    /// Whether the adopter this identity names (`adopted_by`) may serve a
    /// tier whose marker says `found` (read at `what`): the same cluster and
    /// node, and either adopted by this adopter already ([`Adoption::Ours`]),
    /// or `may_take` says yes to its current adopter (`None`: not adopted) —
    /// a node removed for good, or an adopter that was. Anything else is
    /// refused (`ObjectInUse`: another node serves it, or it was not removed).
    pub fn adoption(
        &self,
        found: &TierIdentity,
        what: &str,
        may_take: impl Fn(Option<u32>) -> bool,
    ) -> Result<Adoption> {
        let adopter = self
            .adopted_by
            .ok_or_else(|| ShoalError::invalid("an adoption needs the adopter's id"))?;
        if found.cluster != self.cluster || found.node != self.node {
            return Err(ShoalError::new(
                ErrorKind::InvalidArgument,
                format!("{what} belongs to {found}, not to {self}: not adopted"),
            ));
        }
        match found.adopted_by {
            Some(by) if by == adopter => Ok(Adoption::Ours),
            by if may_take(by) => Ok(Adoption::TakeOver),
            Some(by) => Err(ShoalError::new(
                ErrorKind::ObjectInUse,
                format!("{what} is served by node {by}: not adopted"),
            )),
            None => Err(ShoalError::new(
                ErrorKind::ObjectInUse,
                format!("{what} is node {}'s own: not adopted", found.node),
            )),
        }
    }
}

impl TierIdentity {
    /// The refusal to adopt this node's tier while it is marked stopped
    /// cleanly ([`Tier::mark_stopped`](crate::tier::Tier::mark_stopped)).
    pub(crate) fn stopped_cleanly(&self, what: &str) -> ShoalError {
        ShoalError::new(
            ErrorKind::ObjectInUse,
            format!(
                "{what}: node {} stopped cleanly and is expected back: not adopted",
                self.node
            ),
        )
    }
}

impl fmt::Display for TierIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} of cluster {:?}", self.node, self.cluster)?;
        if let Some(adopter) = self.adopted_by {
            write!(f, " (adopted by node {adopter})")?;
        }
        Ok(())
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

    #[test]
    fn an_adopted_tier_names_its_adopter_and_refuses_its_first_owner() {
        let origin = TierIdentity::new("prod", 3);
        let by1 = origin.clone().adopted(1);
        let text = by1.encode().unwrap();
        assert!(text.ends_with("adopted_by=1\n"), "{text}");
        assert_eq!(TierIdentity::decode(&text, "x").unwrap(), by1);
        // The removed node, back, is refused with the reason.
        let err = origin.check(&by1, "dir").unwrap_err();
        assert!(err.message().contains("adopted by node 1"), "{err}");
        // Adoption: a tier is taken when the caller says its adopter (or
        // its owner, `None`) is gone; its own adopter opens it again
        // whatever; anything else is refused.
        let any = |_| true;
        let never = |_| false;
        assert_eq!(by1.adoption(&origin, "d", any).unwrap(), Adoption::TakeOver);
        let err = by1.adoption(&origin, "d", never).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectInUse);
        assert!(err.message().contains("node 3's own"), "{err}");
        assert_eq!(by1.adoption(&by1, "d", never).unwrap(), Adoption::Ours);
        let by2 = origin.clone().adopted(2);
        let after_1_left = |by: Option<u32>| by == Some(1);
        assert_eq!(
            by2.adoption(&by1, "d", after_1_left).unwrap(),
            Adoption::TakeOver
        );
        let err = by2.adoption(&by1, "d", never).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectInUse);
        assert!(err.message().contains("served by node 1"), "{err}");
        // Another node's or cluster's tier is never adopted as this one.
        assert!(by1
            .adoption(&TierIdentity::new("prod", 4), "d", any)
            .is_err());
        assert!(by1
            .adoption(&TierIdentity::new("test", 3), "d", any)
            .is_err());
        assert!(origin.adoption(&origin, "d", any).is_err());
        assert!(TierIdentity::decode(
            "shoal tier identity v1\ncluster=a\nnode=1\nadopted_by=x\n",
            "x"
        )
        .is_err());
    }
}
