//! The keys a shoal cluster keeps in etcd: O(nodes) small ones, never one
//! per object (what made other stores hang at start with millions of keys).
//!
//! ```text
//! <prefix>/cluster        the cluster's name, a digest of its token and its
//!                         max_nodes: a node of another cluster (or with
//!                         another token or max_nodes) refuses
//! <prefix>/nodes/<id>     a member's `[[node]]` table (TOML): addresses, region,
//!                         access, public key; written at join, gone at leave
//!                         or with the view that removes it; how members whose
//!                         files lack the node learn it
//! <prefix>/live/<id>      its incarnation, bound to its lease: gone when the
//!                         node stops renewing it (kill -9, a partition from etcd)
//! <prefix>/view           the view: `epoch=N members=A,B,…`, changed only by
//!                         a compare-and-swap on its revision
//! ```
//!
//! For N nodes that is 2N + 2 keys; in steady state nothing is written, only
//! the leases are renewed.

/// The key names under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

/// What a key under the prefix names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Cluster,
    View,
    Node(u32),
    Live(u32),
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    /// Every key of the cluster starts with this.
    pub fn all(&self) -> String {
        format!("{}/", self.prefix)
    }

    pub fn cluster(&self) -> String {
        format!("{}/cluster", self.prefix)
    }

    pub fn view(&self) -> String {
        format!("{}/view", self.prefix)
    }

    pub fn node(&self, id: u32) -> String {
        format!("{}/nodes/{id}", self.prefix)
    }

    pub fn live(&self, id: u32) -> String {
        format!("{}/live/{id}", self.prefix)
    }

    /// What `key` names; `None` for anything else under the prefix (left
    /// alone: another tool's key, or a later version's).
    pub fn parse(&self, key: &[u8]) -> Option<Key> {
        let rest = std::str::from_utf8(key).ok()?.strip_prefix(&self.all())?;
        let node = |id: &str| {
            (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
                .then(|| id.parse().ok())
                .flatten()
        };
        match rest.split_once('/') {
            None if rest == "cluster" => Some(Key::Cluster),
            None if rest == "view" => Some(Key::View),
            Some(("nodes", id)) => node(id).map(Key::Node),
            Some(("live", id)) => node(id).map(Key::Live),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_what_they_parse_back_to() {
        let keys = Keys::new("/shoal/demo/");
        assert_eq!(keys.live(3), "/shoal/demo/live/3");
        for (key, want) in [
            (keys.cluster(), Key::Cluster),
            (keys.view(), Key::View),
            (keys.node(12), Key::Node(12)),
            (keys.live(0), Key::Live(0)),
        ] {
            assert_eq!(keys.parse(key.as_bytes()), Some(want), "{key}");
        }
        for other in [
            "/shoal/demo/live/",
            "/shoal/demo/live/+1",
            "/shoal/demo/live/1/x",
            "/shoal/demo/nodes/99999999999",
            "/shoal/demo2/view",
            "/shoal/demo/views",
        ] {
            assert_eq!(keys.parse(other.as_bytes()), None, "{other}");
        }
    }
}
