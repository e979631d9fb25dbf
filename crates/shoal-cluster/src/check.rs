//! The rules a cluster file keeps beyond its syntax, as errors (the file is
//! refused) and warnings (valid, but probably not what was meant; `shoal
//! cluster check` prints them, daemons do not). Every message names the node
//! (or `[cluster]`) and the key.
//!
//! Which nodes share a host decides what must differ: a path (socket,
//! region, burst, key_file) names a file on the host a node runs on, so two
//! nodes may give the same path only if they run on different hosts; an
//! address a node binds (listen, data_listen, metrics) may repeat across
//! hosts too (`0.0.0.0:7700` on every host), while an address peers dial
//! (rpc, data) names one node everywhere. A node's host is [`Node::host`]:
//! its `host` key, else its rpc address's host part. A region with access =
//! "mapped" is mapped by every node at its path, so its path is taken on
//! every host.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use shoal_core::coherence::CoherenceMode;
use shoal_core::error::{Result, ShoalError};

use crate::address::Address;
use crate::topology::{cluster_part, node_part, Access, Checked, FileRepr, Node, Topology};

/// Every rule the file breaks (an empty list: valid).
pub(crate) fn errors(t: &Topology) -> Vec<String> {
    let mut errors = Vec::new();
    if t.nodes.is_empty() {
        errors.push("a cluster needs at least one [[node]]".to_owned());
        return errors;
    }
    let mut ids: Vec<_> = t.nodes.iter().map(|n| n.id).collect();
    ids.sort_unstable();
    match &t.membership {
        // The file lists the nodes it knows; the others join through etcd.
        Some(m) => {
            let mut repeated = ids.clone();
            repeated.dedup();
            if repeated.len() != ids.len() {
                errors.push(format!("node ids repeat: {ids:?}"));
            }
            if let Some(id) = ids.iter().find(|&&id| id >= m.max_nodes) {
                errors.push(format!(
                    "node {id}: ids must be below [cluster] max_nodes ({})",
                    m.max_nodes
                ));
            }
        }
        None if ids.iter().enumerate().any(|(i, &id)| id as usize != i) => {
            errors.push(format!(
                "node ids must be 0..{} with no gaps or repeats, got {ids:?}",
                t.nodes.len()
            ));
        }
        None => {}
    }
    for node in &t.nodes {
        if node.region_size == 0 {
            errors.push(format!("node {}: region_size is 0", node.id));
        }
    }
    dialed_addresses(t, &mut errors);
    bound_addresses(t, &mut errors);
    paths(t, &mut errors);
    transport(t, &mut errors);
    let with_identity = t.nodes.iter().filter(|n| n.identity.is_some()).count();
    if with_identity != 0 && with_identity != t.nodes.len() {
        let without: Vec<_> = t
            .nodes
            .iter()
            .filter(|n| n.identity.is_none())
            .map(|n| n.id)
            .collect();
        errors.push(format!(
            "public_key is on some nodes but not all (not on nodes {without:?}): per-node \
             identities need every node's"
        ));
    }
    if t.simulate_caches && t.coherence != CoherenceMode::Noncoherent {
        errors.push(
            "[cluster] simulate_caches emulates a non-coherent fabric: it needs coherence = \
             \"noncoherent\""
                .to_owned(),
        );
    }
    if t.heartbeat.is_zero() || t.lease < t.heartbeat * 2 {
        errors.push(
            "[cluster] lease_ms must be at least twice heartbeat_ms (and heartbeat_ms > 0)"
                .to_owned(),
        );
    }
    errors
}

/// rpc and data: where peers dial a node. No two may be one address, on any
/// host.
fn dialed_addresses(t: &Topology, errors: &mut Vec<String>) {
    let dialed: Vec<(u32, &str, &Address)> = t
        .nodes
        .iter()
        .flat_map(|n| [(n.id, "rpc", &n.rpc), (n.id, "data", &n.data)])
        .collect();
    for (j, &(b, key_b, address)) in dialed.iter().enumerate() {
        if let Some(&(a, key_a, _)) = dialed[..j].iter().find(|(_, _, other)| *other == address) {
            errors.push(if a == b {
                format!("node {b}: {key_b} address {address} is also its {key_a} address")
            } else {
                format!(
                    "node {b}: {key_b} address {address} is used by another node (node {a}'s {key_a})"
                )
            });
        }
    }
}

/// An address a node binds, and whether it is one of its dialed addresses
/// unchanged (then two equal ones are already reported as dialed).
struct Bound {
    node: u32,
    host: String,
    key: &'static str,
    address: Address,
    dialed: bool,
}

/// listen, data_listen and metrics: two nodes of one host cannot bind the
/// same port on the same (or every) interface.
fn bound_addresses(t: &Topology, errors: &mut Vec<String>) {
    let mut bound = Vec::new();
    for n in &t.nodes {
        let host = n.host();
        let listen_key = if n.listen.is_some() { "listen" } else { "rpc" };
        let data_key = match (&n.data_listen, &n.listen) {
            (Some(_), _) => "data_listen",
            (None, Some(_)) => "data_listen (listen's host, data's port)",
            (None, None) => "data",
        };
        bound.push(Bound {
            node: n.id,
            host: host.clone(),
            key: listen_key,
            address: n.listen_address().clone(),
            dialed: n.listen.is_none(),
        });
        bound.push(Bound {
            node: n.id,
            host: host.clone(),
            key: data_key,
            address: n.data_listen_address(),
            dialed: n.listen.is_none() && n.data_listen.is_none(),
        });
        if let Some(metrics) = n.metrics {
            bound.push(Bound {
                node: n.id,
                host,
                key: "metrics",
                address: metrics.into(),
                dialed: false,
            });
        }
    }
    let clash = |x: &Address, y: &Address| {
        x.port() == y.port() && (x == y || x.is_unspecified() || y.is_unspecified())
    };
    for (j, b) in bound.iter().enumerate() {
        let first = bound[..j]
            .iter()
            .find(|a| a.host == b.host && clash(&a.address, &b.address) && !(a.dialed && b.dialed));
        if let Some(a) = first {
            errors.push(if a.node == b.node {
                format!(
                    "node {}: {} address {} is also its {} address {}",
                    b.node, b.key, b.address, a.key, a.address
                )
            } else {
                format!(
                    "node {}: {} address {} is used by another node on host {:?} (node {}'s {} \
                     address {})",
                    b.node, b.key, b.address, b.host, a.node, a.key, a.address
                )
            });
        }
    }
}

/// A path a node uses, and on which hosts it is taken.
struct Taken<'a> {
    node: u32,
    host: String,
    key: &'static str,
    path: &'a Path,
    /// A mapped region: every node maps it at this path, on every host.
    everywhere: bool,
}

/// socket, region, burst, key_file: one file (or directory) per host each.
fn paths(t: &Topology, errors: &mut Vec<String>) {
    let mut taken = Vec::new();
    for n in &t.nodes {
        let host = n.host();
        let own: [(&'static str, Option<&Path>); 4] = [
            ("socket", Some(n.socket.as_path())),
            ("region", Some(n.region.as_path())),
            ("burst", n.tiers.burst.as_deref()),
            (
                "key_file",
                n.identity.as_ref().map(|i| i.key_file.as_path()),
            ),
        ];
        for (key, path) in own {
            if let Some(path) = path {
                taken.push(Taken {
                    node: n.id,
                    host: host.clone(),
                    key,
                    path,
                    everywhere: key == "region" && n.access == Access::Mapped,
                });
            }
        }
    }
    for (j, b) in taken.iter().enumerate() {
        let first = taken[..j]
            .iter()
            .find(|a| a.path == b.path && (a.host == b.host || a.everywhere || b.everywhere));
        let Some(a) = first else { continue };
        let path = b.path.display();
        errors.push(if a.node == b.node {
            format!("node {}: {} {path} is also its {}", b.node, b.key, a.key)
        } else if a.host == b.host {
            format!(
                "node {}: {} {path} is used by another node on host {:?} (node {}'s {})",
                b.node, b.key, b.host, a.node, a.key
            )
        } else {
            let mapped = if a.everywhere { a.node } else { b.node };
            format!(
                "node {}: {} {path} is used by another node (node {}'s {}): node {mapped}'s \
                 region is mapped by every node at that path (access = \"mapped\"), on host \
                 {:?} as on {:?}",
                b.node, b.key, a.node, a.key, a.host, b.host
            )
        });
    }
}

/// What is valid but probably not meant (the file has no errors).
pub(crate) fn warnings(t: &Topology) -> Vec<String> {
    let mut warnings = Vec::new();
    if !t.has_identities() {
        warnings.push(
            "no node has public_key and key_file: peers prove only the shared token, so any \
             member can speak as any node; give every node a key pair (`shoal cluster keygen`, \
             docs/deployment.md)"
                .to_owned(),
        );
    }
    let hosts = hosts(t);
    for n in &t.nodes {
        let host = n.host();
        let elsewhere: Vec<_> = t.nodes.iter().filter(|m| m.host() != host).collect();
        let named = |nodes: &[&Node]| {
            nodes
                .iter()
                .map(|m| format!("node {} on {:?}", m.id, m.host()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if n.access == Access::Mapped && !elsewhere.is_empty() {
            warnings.push(format!(
                "node {}: access = \"mapped\" (the default) has every node map its region {} at \
                 that path, also {}, right only if that path is memory the hosts share (a \
                 fabric); for a node other hosts reach over the network write access = \"host\" \
                 (mapped by the nodes of host {host:?}, pulled by the others) or \"network\"",
                n.id,
                n.region.display(),
                named(&elsewhere),
            ));
        }
        for (key, address) in [("rpc", &n.rpc), ("data", &n.data)] {
            if address.is_unspecified() {
                warnings.push(format!(
                    "node {}: {key} address {address} is where peers dial the node, and {} names \
                     no host; give its address or host name, and bind every interface with \
                     listen (and data_listen)",
                    n.id,
                    address.host()
                ));
            }
            if address.port() == 0 {
                warnings.push(format!(
                    "node {}: {key} address {address} has port 0, which no peer can dial",
                    n.id
                ));
            }
        }
        if !elsewhere.is_empty() {
            let mut loopback = Vec::new();
            if n.rpc.is_loopback() {
                loopback.push(("rpc", n.rpc.clone()));
            }
            if n.data.is_loopback() {
                loopback.push(("data", n.data.clone()));
            }
            if n.listen.as_ref().is_some_and(Address::is_loopback) {
                loopback.push(("listen", n.listen_address().clone()));
            }
            if n.data_listen.is_some() && n.data_listen_address().is_loopback() {
                loopback.push(("data_listen", n.data_listen_address()));
            }
            for (key, address) in loopback {
                warnings.push(format!(
                    "node {}: {key} address {address} is a loopback address, which {} cannot \
                     reach",
                    n.id,
                    named(&elsewhere)
                ));
            }
        }
    }
    if hosts.len() > 1 && t.simulate_caches {
        warnings.push(
            "[cluster] simulate_caches emulates a fabric on one host, but the nodes run on \
             several hosts"
                .to_owned(),
        );
    }
    warnings
}

/// The nodes of each host, by host.
pub fn hosts(t: &Topology) -> BTreeMap<String, Vec<u32>> {
    let mut hosts: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for n in &t.nodes {
        hosts.entry(n.host()).or_default().push(n.id);
    }
    hosts
}

/// What can only be checked from the machine the check runs on: host names
/// that do not resolve here (or resolve to a loopback address while other
/// hosts must reach them), and a token file others can read. `resolve` is
/// [`Address::resolve`] (a parameter so tests need no resolver).
pub fn environment(
    t: &Topology,
    token_file: Option<&Path>,
    resolve: impl Fn(&Address) -> std::io::Result<Vec<SocketAddr>>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let several_hosts = hosts(t).len() > 1;
    for n in &t.nodes {
        let mut dialed = vec![("rpc", &n.rpc), ("data", &n.data)];
        if let Some(listen) = &n.listen {
            dialed.push(("listen", listen));
        }
        if let Some(listen) = &n.data_listen {
            dialed.push(("data_listen", listen));
        }
        for (key, address) in dialed {
            if address.ip().is_some() {
                continue;
            }
            match resolve(address) {
                Err(e) => warnings.push(format!(
                    "node {}: {key} host {:?} does not resolve here ({e}); it is looked up \
                     again at every connection, and every host must resolve it",
                    n.id,
                    address.host()
                )),
                Ok(found)
                    if several_hosts
                        && !address.is_loopback()
                        && !found.is_empty()
                        && found.iter().all(|a| a.ip().is_loopback()) =>
                {
                    warnings.push(format!(
                        "node {}: {key} host {:?} resolves here to a loopback address ({}): \
                         if it does so on its own host, the node binds loopback only and \
                         other hosts cannot reach it (check /etc/hosts, or set listen)",
                        n.id,
                        address.host(),
                        found[0].ip()
                    ))
                }
                Ok(_) => {}
            }
        }
    }
    if let Some(path) = token_file {
        warnings.extend(readable_by_others(path));
    }
    warnings
}

/// Peer traffic leaves a host only encrypted unless the file says it may
/// not be: a node with an address other peers reach from another host
/// (anything but loopback, a wildcard `listen` included) needs the cluster
/// CA (`tls_ca`, and every node its certificate) or `insecure_cleartext`.
fn transport(t: &Topology, errors: &mut Vec<String>) {
    if t.tls.is_some() {
        let without: Vec<_> = t
            .nodes
            .iter()
            .filter(|n| n.tls.is_none())
            .map(|n| n.id)
            .collect();
        if !without.is_empty() {
            errors.push(format!(
                "[cluster] tls_ca needs every node's tls_cert and tls_key (not on nodes \
                 {without:?}): `shoal cluster keygen --ca` makes them"
            ));
        }
        return;
    }
    for n in &t.nodes {
        if n.tls.is_some() {
            errors.push(format!(
                "node {}: tls_cert without [cluster] tls_ca: signed by which CA?",
                n.id
            ));
        }
    }
    if t.insecure_cleartext {
        return;
    }
    let mut leaving = t.nodes.iter().filter_map(|n| {
        let data_listen = n.data_listen_address();
        [
            ("rpc", n.rpc.clone()),
            ("data", n.data.clone()),
            ("listen", n.listen_address().clone()),
            ("data_listen", data_listen),
        ]
        .into_iter()
        .find(|(_, a)| !a.is_loopback())
        .map(|(key, address)| (n.id, format!("node {}'s {key} {address}", n.id)))
    });
    if let Some((first, example)) = leaving.next() {
        let ids: Vec<u32> = std::iter::once(first)
            .chain(leaving.map(|(id, _)| id))
            .collect();
        errors.push(format!(
            "nodes {ids:?} are reached from other hosts ({example} is not a loopback address), \
             and peer traffic between hosts is encrypted unless the file says otherwise: set \
             [cluster] tls_ca and each node's tls_cert and tls_key (`shoal cluster ca`, \
             `shoal cluster keygen --ca`), or insecure_cleartext = true on a private network"
        ));
    }
}

/// A file holding the token that other users can read.
fn readable_by_others(path: &Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    (mode & 0o077 != 0).then(|| {
        format!(
            "[cluster] the token is in {}, which other users can read or write (mode {:o}): \
             chmod 600 it",
            path.display(),
            mode & 0o777
        )
    })
}

/// The file the cluster's token comes from: token_file (relative to the
/// cluster file), or the cluster file itself when the token is written in it.
pub fn token_source(text: &str, file: &Path) -> Option<PathBuf> {
    let table: toml::Table = toml::from_str(text).ok()?;
    let cluster = table.get("cluster")?.as_table()?;
    if cluster.contains_key("token") {
        return Some(file.to_path_buf());
    }
    let token_file = Path::new(cluster.get("token_file")?.as_str()?);
    Some(match file.parent() {
        Some(dir) if token_file.is_relative() => dir.join(token_file),
        _ => token_file.to_path_buf(),
    })
}

// Parsing lives here rather than in `topology` so that the validation it
// runs stays one import away: check → topology, never back.
impl Topology {
    /// Parses a cluster file's text; a relative `token_file` or `key_file` is
    /// read from `base`. Every error found is in the message.
    pub fn parse(text: &str, base: Option<&Path>) -> Result<Self> {
        let checked = Self::check(text, base);
        match checked.topology {
            Some(topology) if checked.errors.is_empty() => Ok(topology),
            _ => Err(ShoalError::invalid(checked.errors.join("; "))),
        }
    }

    /// Node `id` as a member published itself in the membership service
    /// ([`Topology::node_record`]'s text): parsed like a `[[node]]` table of
    /// this file, and checked with this file's nodes (no address or path
    /// of theirs taken, identities on all or none). The file's own entry
    /// for `id`, if any, is replaced in that check.
    pub fn parse_record(&self, id: u32, record: &str) -> Result<Node> {
        let mut errors = Vec::new();
        let table: toml::Table = toml::from_str(record)
            .map_err(|e| ShoalError::invalid(format!("node {id}'s record: {e}")))?;
        let mut tables = match table.get("node") {
            Some(toml::Value::Array(tables)) if tables.len() == 1 => tables.clone(),
            _ => {
                return Err(ShoalError::invalid(format!(
                    "node {id}'s record is not one [[node]] table"
                )))
            }
        };
        let Some(toml::Value::Table(table)) = tables.pop() else {
            return Err(ShoalError::invalid(format!(
                "node {id}'s record is not one [[node]] table"
            )));
        };
        let node = node_part(0, table, None, &mut errors);
        let node = match node {
            Some(node) if errors.is_empty() => node,
            _ => return Err(ShoalError::invalid(errors.join("; "))),
        };
        if node.id != id {
            return Err(ShoalError::invalid(format!(
                "node {id}'s record describes node {}",
                node.id
            )));
        }
        let mut with = self.clone();
        with.put_node(node.clone());
        let errors = self::errors(&with);
        if !errors.is_empty() {
            return Err(ShoalError::invalid(format!(
                "node {id}'s record does not fit this cluster: {}",
                errors.join("; ")
            )));
        }
        Ok(node)
    }

    /// Reads and validates a cluster file as if its `[cluster]` table said
    /// `membership = url` (`shoal serve --membership`): the rules of a file
    /// with a membership apply, so it may list only some nodes.
    pub fn load_with_membership(
        path: &Path,
        url: &crate::membership_url::MembershipUrl,
    ) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ShoalError::io(&format!("read cluster file {}", path.display()), e))?;
        let checked = Self::check_with(&text, path.parent(), Some(url));
        match checked.topology {
            Some(topology) if checked.errors.is_empty() => Ok(topology),
            _ => Err(ShoalError::invalid(format!(
                "{}: {}",
                path.display(),
                checked.errors.join("; ")
            ))),
        }
    }

    /// Parses and validates a cluster file's text, collecting every error
    /// (not only the first) and the warnings (`shoal cluster check`).
    pub fn check(text: &str, base: Option<&Path>) -> Checked {
        Self::check_with(text, base, None)
    }

    fn check_with(
        text: &str,
        base: Option<&Path>,
        membership: Option<&crate::membership_url::MembershipUrl>,
    ) -> Checked {
        let mut errors = Vec::new();
        let mut file: FileRepr = match toml::from_str(text) {
            Ok(file) => file,
            Err(e) => {
                return Checked {
                    topology: None,
                    errors: vec![e.to_string().trim_end().to_owned()],
                    warnings: Vec::new(),
                }
            }
        };
        if let Some(url) = membership {
            file.cluster
                .insert("membership".into(), toml::Value::String(url.to_string()));
        }
        let cluster = cluster_part(file.cluster, base, &mut errors);
        let nodes: Vec<_> = file
            .node
            .into_iter()
            .enumerate()
            .map(|(place, table)| node_part(place, table, base, &mut errors))
            .collect();
        let nodes: Option<Vec<Node>> = nodes.into_iter().collect();
        let (Some(cluster), Some(nodes)) = (cluster, nodes) else {
            return Checked {
                topology: None,
                errors,
                warnings: Vec::new(),
            };
        };
        let mut nodes = nodes;
        nodes.sort_by_key(|n| n.id);
        let topology = Topology {
            name: cluster.name,
            token: cluster.token,
            coherence: cluster.coherence,
            simulate_caches: cluster.simulate_caches,
            heartbeat: cluster.heartbeat,
            lease: cluster.lease,
            linger: cluster.linger,
            quarantine: cluster.quarantine,
            membership: cluster.membership,
            tls: cluster.tls,
            insecure_cleartext: cluster.insecure_cleartext,
            nodes,
        };
        errors.extend(self::errors(&topology));
        let mut warnings = Vec::new();
        if errors.is_empty() {
            if cluster.token_inline {
                warnings.push(
                    "[cluster] token is written in the file: keep the file owner-only (mode 600) \
                     on every host, or move the token to token_file"
                        .to_owned(),
                );
            }
            warnings.extend(self::warnings(&topology));
        }
        Checked {
            topology: errors.is_empty().then_some(topology),
            errors,
            warnings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three nodes on two hosts, one file for all: nodes 0 and 1 share host
    /// alpha (each maps the other's region), node 2 runs on beta (its host
    /// from its rpc address) with the same paths and bound addresses as
    /// node 0.
    const NODES: [&str; 3] = [
        "host = \"alpha\"\nrpc = \"alpha.example:7700\"\nlisten = \"0.0.0.0:7700\"\n\
         socket = \"/run/shoal/shoal.sock\"\nregion = \"/dev/shm/shoal\"\naccess = \"host\"\n\
         metrics = \"0.0.0.0:9464\"",
        "host = \"alpha\"\nrpc = \"alpha.example:7710\"\nlisten = \"0.0.0.0:7710\"\n\
         socket = \"/run/shoal/shoal-1.sock\"\nregion = \"/dev/shm/shoal-1\"\naccess = \"host\"\n\
         metrics = \"0.0.0.0:9465\"",
        "rpc = \"beta:7700\"\nlisten = \"0.0.0.0:7700\"\n\
         socket = \"/run/shoal/shoal.sock\"\nregion = \"/dev/shm/shoal\"\naccess = \"host\"\n\
         metrics = \"0.0.0.0:9464\"",
    ];

    /// A cluster file of these nodes (ids 0.. in order).
    fn file(nodes: &[String]) -> String {
        let mut text =
            "[cluster]\nname = \"prod\"\ntoken = \"secret\"\ninsecure_cleartext = true\n"
                .to_owned();
        for (id, node) in nodes.iter().enumerate() {
            let size = if node.contains("region_size") {
                ""
            } else {
                "region_size = \"1GiB\"\n"
            };
            text += &format!("\n[[node]]\nid = {id}\n{size}{node}\n");
        }
        text
    }

    /// The three nodes with node `which`'s text edited by `edit`.
    fn with(which: usize, edit: impl Fn(&str) -> String) -> String {
        let nodes: Vec<String> = NODES
            .iter()
            .enumerate()
            .map(|(i, n)| if i == which { edit(n) } else { n.to_string() })
            .collect();
        file(&nodes)
    }

    fn hosts_file() -> String {
        with(usize::MAX, str::to_owned)
    }

    fn one_error(text: &str) -> String {
        let errors = Topology::check(text, None).errors;
        assert_eq!(errors.len(), 1, "{errors:#?}");
        errors.into_iter().next().unwrap()
    }

    #[test]
    fn one_file_serves_every_host() {
        let checked = Topology::check(&hosts_file(), None);
        assert!(checked.errors.is_empty(), "{:#?}", checked.errors);
        let t = checked.topology.unwrap();
        assert_eq!(
            t.nodes.iter().map(Node::host).collect::<Vec<_>>(),
            ["alpha", "alpha", "beta"]
        );
        assert_eq!(
            hosts(&t),
            BTreeMap::from([("alpha".into(), vec![0, 1]), ("beta".into(), vec![2])])
        );
        // Peers dial the names; each node binds every interface.
        let n0 = t.node(0).unwrap();
        assert_eq!(n0.rpc.to_string(), "alpha.example:7700");
        assert_eq!(n0.data.to_string(), "alpha.example:7701");
        assert_eq!(n0.listen_address().to_string(), "0.0.0.0:7700");
        assert_eq!(n0.data_listen_address().to_string(), "0.0.0.0:7701");
        // Mixed access: mapped within a host, pulled across hosts.
        assert!(t.maps(0, 1) && t.maps(1, 0) && t.maps(2, 2) && t.maps(0, 0));
        assert!(!t.maps(0, 2) && !t.maps(2, 0) && !t.maps(1, 2) && !t.maps(2, 1));
        assert!(t.shares_host(0, 1) && !t.shares_host(1, 2));
        assert_eq!(Topology::parse(&t.to_toml(), None).unwrap(), t);
    }

    #[test]
    fn mapped_and_network_keep_their_meaning_on_every_host() {
        let text = file(&[
            NODES[0].replace("\"host\"", "\"mapped\""),
            NODES[1].replace("\"host\"", "\"network\""),
            NODES[2].replace("/dev/shm/shoal\"", "/dev/shm/shoal-2\""),
        ]);
        let t = Topology::parse(&text, None).unwrap();
        // mapped: every node maps it, whatever its host (a fabric).
        assert_eq!(t.node(0).unwrap().access, Access::Mapped);
        assert!(t.maps(2, 0) && t.maps(1, 0));
        // network: nobody else maps it, not even a node of its host.
        assert_eq!(t.node(1).unwrap().access, Access::Network);
        assert!(!t.maps(0, 1) && !t.maps(2, 1));
    }

    #[test]
    fn the_same_paths_on_one_host_are_refused_naming_both_nodes() {
        for (key, path) in [
            ("socket", "/run/shoal/shoal.sock"),
            ("region", "/dev/shm/shoal"),
        ] {
            // Node 1 (on alpha) takes node 0's path; node 2 (beta) has it too.
            let text = with(1, |n| {
                n.replace(
                    &path
                        .replace("shoal.sock", "shoal-1.sock")
                        .replace("shm/shoal", "shm/shoal-1"),
                    path,
                )
            });
            let err = one_error(&text);
            assert_eq!(
                err,
                format!("node 1: {key} {path} is used by another node on host \"alpha\" (node 0's {key})")
            );
        }
        // A path counts across keys: node 1's socket is node 0's region.
        let err = one_error(&with(1, |n| {
            n.replace("/run/shoal/shoal-1.sock", "/dev/shm/shoal")
        }));
        assert!(err.starts_with("node 1: socket /dev/shm/shoal is used by another node on host \"alpha\" (node 0's region)"), "{err}");
        // Every loopback address is one host, "localhost": nodes dialed at
        // 127.0.0.1, 127.0.0.2 and localhost with one socket clash.
        let local = file(&[
            NODES[0]
                .replace("host = \"alpha\"\n", "")
                .replace("alpha.example", "127.0.0.1"),
            NODES[1]
                .replace("host = \"alpha\"\n", "")
                .replace("alpha.example", "localhost"),
            NODES[2]
                .replace("beta:7700", "127.0.0.2:7720")
                .replace("listen = \"0.0.0.0:7700\"\n", "")
                .replace("/dev/shm/shoal\"", "/dev/shm/shoal-2\"")
                .replace("9464", "9466"),
        ]);
        assert_eq!(
            one_error(&local),
            "node 2: socket /run/shoal/shoal.sock is used by another node on host \"localhost\" (node 0's socket)"
        );
    }

    #[test]
    fn a_mapped_region_takes_its_path_on_every_host() {
        // Node 2 on beta would map node 0's /dev/shm/shoal on beta: its own.
        let err = one_error(&with(0, |n| n.replace("\"host\"", "\"mapped\"")));
        assert!(
            err.starts_with(
                "node 2: region /dev/shm/shoal is used by another node (node 0's region)"
            ) && err.contains("(access = \"mapped\"), on host \"alpha\" as on \"beta\""),
            "{err}"
        );
    }

    #[test]
    fn bound_addresses_clash_only_on_one_host() {
        // Node 2's listen and metrics are node 0's (beta vs alpha): fine.
        assert!(Topology::check(&hosts_file(), None).errors.is_empty());
        for (from, to, expected) in [
            ("0.0.0.0:7710", "0.0.0.0:7700", "node 1: listen address 0.0.0.0:7700 is used by another node on host \"alpha\" (node 0's listen address 0.0.0.0:7700)"),
            // Every interface includes 10.0.0.1.
            ("0.0.0.0:7710", "10.0.0.1:7700", "node 1: listen address 10.0.0.1:7700 is used by another node on host \"alpha\" (node 0's listen address 0.0.0.0:7700)"),
            ("0.0.0.0:9465", "127.0.0.1:9464", "node 1: metrics address 127.0.0.1:9464 is used by another node on host \"alpha\" (node 0's metrics address 0.0.0.0:9464)"),
            // Node 1's data channel binds listen's host with data's port.
            ("0.0.0.0:9465", "0.0.0.0:7711", "node 1: metrics address 0.0.0.0:7711 is also its data_listen (listen's host, data's port) address 0.0.0.0:7711"),
        ] {
            assert_eq!(one_error(&with(1, |n| n.replace(from, to))), expected);
        }
    }

    #[test]
    fn dialed_addresses_name_one_node_everywhere() {
        let err = one_error(&with(2, |n| {
            n.replace(
                "beta:7700",
                "alpha.example:7700\"\ndata = \"beta:7701\"\nhost = \"beta",
            )
        }));
        assert_eq!(
            err,
            "node 2: rpc address alpha.example:7700 is used by another node (node 0's rpc)"
        );
        // Node 1 dialed where node 0's data channel is (rpc port + 1).
        let err = one_error(&with(1, |n| {
            n.replace("alpha.example:7710", "alpha.example:7701")
        }));
        assert_eq!(
            err,
            "node 1: rpc address alpha.example:7701 is used by another node (node 0's data)"
        );
    }

    #[test]
    fn every_error_is_reported_each_naming_its_node_and_key() {
        let text = file(&[
            format!("{}\nregion_size = \"lots\"", NODES[0]),
            NODES[1].replace("\"host\"", "\"sometimes\""),
            NODES[2].replace("beta:7700", "beta"),
        ]);
        let errors = Topology::check(&text, None).errors;
        assert_eq!(errors.len(), 3, "{errors:#?}");
        assert!(
            errors[0].starts_with("node 0: region_size \"lots\""),
            "{}",
            errors[0]
        );
        assert!(
            errors[1].starts_with("node 1: access: access mode \"sometimes\" is not"),
            "{}",
            errors[1]
        );
        assert!(
            errors[2].starts_with("node 2: rpc address \"beta\": expected HOST:PORT"),
            "{}",
            errors[2]
        );
        let parsed = Topology::parse(&text, None).unwrap_err().to_string();
        assert!(
            errors.iter().all(|e| parsed.contains(e.as_str())),
            "{parsed}"
        );
        // A missing key, an unknown one, an empty host: each names its node.
        let err = one_error(&with(1, |n| {
            n.replace("socket = \"/run/shoal/shoal-1.sock\"\n", "")
        }));
        assert!(err.starts_with("node 1: missing field `socket`"), "{err}");
        let err = one_error(&with(2, |n| n.replace("listen", "listne")));
        assert!(err.starts_with("node 2: unknown field `listne`"), "{err}");
        let err = one_error(&with(1, |n| n.replace("host = \"alpha\"", "host = \" \"")));
        assert!(err.starts_with("node 1: host is empty"), "{err}");
    }

    #[test]
    fn warnings_name_the_node_and_what_to_write() {
        let warnings = Topology::check(&hosts_file(), None).warnings;
        assert_eq!(warnings.len(), 2, "{warnings:#?}");
        assert!(warnings[0].starts_with("[cluster] token is written in the file"));
        assert!(warnings[1].starts_with("no node has public_key"));
        // The default access across hosts: node 2 would map node 0's and
        // node 1's regions at their paths on beta.
        let mapped = file(&[
            NODES[0].replace("access = \"host\"\n", ""),
            NODES[1].replace("access = \"host\"\n", ""),
            NODES[2]
                .replace("\"host\"", "\"network\"")
                .replace("/dev/shm/shoal\"", "/dev/shm/shoal-2\""),
        ]);
        let checked = Topology::check(&mapped, None);
        assert!(checked.errors.is_empty(), "{:#?}", checked.errors);
        let about_mapped: Vec<_> = checked
            .warnings
            .iter()
            .filter(|w| w.contains("access = \"mapped\" (the default)"))
            .collect();
        assert_eq!(about_mapped.len(), 2, "{:#?}", checked.warnings);
        assert!(about_mapped[0].starts_with("node 0: access = \"mapped\" (the default) has every node map its region /dev/shm/shoal at that path, also node 2 on \"beta\""), "{}", about_mapped[0]);
        assert!(
            about_mapped[1].starts_with("node 1:")
                && about_mapped[1].contains("write access = \"host\"")
        );
        // Addresses other hosts cannot dial.
        let text = file(&[
            NODES[0].to_owned(),
            NODES[1].replace("alpha.example:7710", "127.0.0.1:7710"),
            NODES[2].replace("beta:7700", "0.0.0.0:7700\"\nhost = \"beta"),
        ]);
        let warnings = Topology::check(&text, None).warnings;
        assert!(warnings.iter().any(|w| w.starts_with("node 1: rpc address 127.0.0.1:7710 is a loopback address, which node 2 on \"beta\" cannot reach")), "{warnings:#?}");
        assert!(
            warnings
                .iter()
                .any(|w| w
                    .starts_with("node 2: rpc address 0.0.0.0:7700 is where peers dial the node")),
            "{warnings:#?}"
        );
        // One host, as `shoal cluster up` writes it: mapped and loopback are right.
        let local = file(&[
            "rpc = \"127.0.0.1:7700\"\nsocket = \"/tmp/n0.sock\"\nregion = \"/dev/shm/n0\""
                .to_owned(),
            "rpc = \"127.0.0.1:7702\"\nsocket = \"/tmp/n1.sock\"\nregion = \"/dev/shm/n1\""
                .to_owned(),
        ]);
        let checked = Topology::check(&local, None);
        assert!(checked.errors.is_empty(), "{:#?}", checked.errors);
        assert_eq!(checked.warnings.len(), 2, "{:#?}", checked.warnings);
    }

    #[test]
    fn names_that_do_not_resolve_here_are_warned_about() {
        let t = Topology::parse(&hosts_file(), None).unwrap();
        let resolve = |a: &Address| -> std::io::Result<Vec<SocketAddr>> {
            match a.host().as_str() {
                "alpha.example" => Ok(vec![SocketAddr::new(
                    "127.0.1.1".parse().unwrap(),
                    a.port(),
                )]),
                "beta" => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such host",
                )),
                other => panic!("only names are resolved, not {other}"),
            }
        };
        let warnings = environment(&t, None, resolve);
        assert_eq!(warnings.len(), 6, "{warnings:#?}");
        assert!(warnings[0].starts_with("node 0: rpc host \"alpha.example\" resolves here to a loopback address (127.0.1.1)"), "{}", warnings[0]);
        assert!(
            warnings[4]
                .starts_with("node 2: rpc host \"beta\" does not resolve here (no such host)"),
            "{}",
            warnings[4]
        );
        assert!(
            warnings[5].starts_with("node 2: data host \"beta\""),
            "{}",
            warnings[5]
        );
    }

    #[test]
    fn a_token_file_others_can_read_is_warned_about() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file_path = dir.path().join("cluster.toml");
        let token = dir.path().join("token");
        std::fs::write(&token, "secret\n").unwrap();
        let text = hosts_file().replace("token = \"secret\"", "token_file = \"token\"");
        assert_eq!(token_source(&text, &file_path), Some(token.clone()));
        assert_eq!(
            token_source(&hosts_file(), &file_path),
            Some(file_path.clone())
        );
        let t = Topology::parse(&text, Some(dir.path())).unwrap();
        assert_eq!(t.token, "secret");
        let no_names = |_: &Address| Ok(Vec::new());
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(environment(&t, Some(token.as_path()), no_names).is_empty());
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        let warnings = environment(&t, Some(token.as_path()), no_names);
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].contains("(mode 644): chmod 600"),
            "{}",
            warnings[0]
        );
    }

    /// With a membership a file lists some of the nodes, any ids below
    /// max_nodes; the others come as records, checked against the file.
    #[test]
    fn with_a_membership_the_file_lists_some_nodes_and_records_fill_in_the_rest() {
        let membership = "membership = \"etcd://127.0.0.1:2379/prod\"\nmax_nodes = 16\n";
        let text = hosts_file().replacen(
            "token = \"secret\"\n",
            &format!("token = \"secret\"\n{membership}"),
            1,
        );
        let full = Topology::parse(&text, None).unwrap();
        assert_eq!(full.slots(), 16);
        // Members agree on max_nodes: a node with another one brings another stamp.
        let mut other = full.clone();
        other.membership.as_mut().unwrap().max_nodes = 32;
        assert_ne!(full.membership_stamp(), other.membership_stamp());
        let record = full.node_record(2).unwrap();
        // The file of host alpha: its two nodes, node 1 renumbered 9.
        let alpha = text
            .split("\n[[node]]")
            .take(3)
            .collect::<Vec<_>>()
            .join("\n[[node]]")
            .replace("id = 1\n", "id = 9\n");
        let mut alpha = Topology::parse(&alpha, None).unwrap();
        assert_eq!(alpha.ids().collect::<Vec<_>>(), [0, 9]);
        assert!(alpha
            .node(2)
            .unwrap_err()
            .message()
            .contains("not known here"));
        let two = alpha.parse_record(2, &record).unwrap();
        assert_eq!(&two, full.node(2).unwrap());
        assert!(alpha.put_node(two.clone()));
        assert!(!alpha.put_node(two));
        assert_eq!(alpha.ids().collect::<Vec<_>>(), [0, 2, 9]);
        assert!(alpha.maps(0, 9) && !alpha.maps(0, 2));
        // A record that is not the node it is filed under, is garbage, takes
        // a dialed address of the file's or an id past the slots: refused.
        let err = |id, record: &str| {
            alpha
                .parse_record(id, record)
                .unwrap_err()
                .message()
                .to_owned()
        };
        assert!(
            err(3, &record).contains("describes node 2"),
            "{}",
            err(3, &record)
        );
        assert!(err(3, "id = 3").contains("not one [[node]] table"));
        let clash = record.replace("beta:7700", "alpha.example:7700");
        assert!(
            err(2, &clash).contains("alpha.example:7700"),
            "{}",
            err(2, &clash)
        );
        let far = record.replace("id = 2", "id = 16");
        assert!(err(16, &far).contains("max_nodes"), "{}", err(16, &far));
        // Ids past max_nodes in the file, repeats, and max_nodes alone.
        let text16 = text.replace("id = 2\n", "id = 16\n");
        assert!(one_error(&text16).contains("below [cluster] max_nodes (16)"));
        let repeat = text.replace("id = 2\n", "id = 0\n");
        assert!(Topology::parse(&repeat, None)
            .unwrap_err()
            .message()
            .contains("repeat"));
        let alone = hosts_file().replacen(
            "token = \"secret\"\n",
            "token = \"secret\"\nmax_nodes = 8\n",
            1,
        );
        assert!(one_error(&alone).contains("max_nodes needs membership"));
        let static_gap = hosts_file().replace("id = 2\n", "id = 5\n");
        assert!(one_error(&static_gap).contains("no gaps"));
    }
}
