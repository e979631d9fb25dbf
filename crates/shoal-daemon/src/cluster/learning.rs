//! Members absent from this node's cluster file: with a membership, a file
//! may list only the nodes its host runs, and every member publishes its
//! `[[node]]` table in etcd when it joins (`shoal_membership::keys`). Before
//! this node adopts a view, it learns every record it has not seen: the
//! record is checked against the file's rules (`Topology::parse_record`),
//! the node is admitted by this node's peer check and credentials, dialed,
//! given a store principal, and its table joins the topology, so homes,
//! gets, pulls and adoption treat it as one of the file's.
//!
//! The file's own tables win over records (an operator's file is what this
//! host was told); a record that breaks a rule is refused with an ERROR
//! line, once per record text, and the node stays unknown here: calls to
//! it fail `NodeUnavailable` ("not known here yet").

use shoal_cluster::proto::NodeRecord;

use crate::cluster::state::Cluster;

impl Cluster {
    /// Learns the members whose records (by node id, the membership's
    /// TOML) this node has not seen yet, or whose record changed.
    #[cfg(feature = "etcd")]
    pub(crate) fn learn_members(&self, records: &std::collections::BTreeMap<u32, String>) {
        for (&id, record) in records {
            if id == self.me || self.in_file.contains(&id) {
                continue;
            }
            if self.records_seen.borrow().get(&id) == Some(record) {
                continue;
            }
            self.records_seen.borrow_mut().insert(id, record.clone());
            if let Err(err) = self.learn_member(id, record) {
                tracing::error!(
                    node = id,
                    %err,
                    "refused a member's record: calls to it fail until it joins with one that fits"
                );
            }
        }
    }

    #[cfg(feature = "etcd")]
    fn learn_member(&self, id: u32, record: &str) -> shoal_core::error::Result<()> {
        let node = self.topology().parse_record(id, record)?;
        self.identity.learn(&node)?;
        self.peers.dial(&node, &self.identity)?;
        let first = self.topology().node(id).is_err();
        if first {
            self.node
                .mutate(|store| store.register_client(crate::principals::peer(id)));
        }
        tracing::info!(
            node = id,
            rpc = %node.rpc,
            host = %node.host(),
            access = node.access.as_str(),
            "learned a member absent from the cluster file{}",
            if first { "" } else { " (its record changed)" }
        );
        self.node.metrics().info.put_peer(id, node.metrics);
        self.topology.borrow_mut().put_node(node);
        Ok(())
    }

    /// The tables of the members learned here (not in the file), as
    /// records: what `shoal cluster status` reaches them by.
    pub(crate) fn learned_records(&self) -> Vec<NodeRecord> {
        let topology = self.topology();
        topology
            .ids()
            .filter(|id| *id != self.me && !self.in_file.contains(id))
            .filter_map(|node| {
                let record = topology.node_record(node).ok()?;
                Some(NodeRecord { node, record })
            })
            .collect()
    }
}
