//! The cluster file: who the nodes are and how this host reaches their memory.
//!
//! Every daemon and client of a cluster reads the same TOML file, on every
//! host: the nodes (ids 0..n-1), and with `membership` the etcd that says
//! which nodes are members now (`view`; otherwise all are, always). With a
//! membership the file may list only some nodes (at least the ones its host
//! runs, ids below `max_nodes`): the others publish their `[[node]]` table in
//! etcd when they join, and every member learns it from there. Every
//! key, its default and
//! a walkthrough for real hosts: docs/deployment.md; the rules a file must
//! keep (and what `shoal cluster check` warns about): `check`.
//!
//! ```toml
//! [cluster]
//! name = "demo"
//! token = "a shared secret"     # or token_file = "/path/to/token"
//! coherence = "coherent"        # or "noncoherent" (real fabrics: flush/invalidate)
//! heartbeat_ms = 200
//! lease_ms = 2000
//! linger_ms = 1000              # keep a released remote reference this long (0: off)
//! quarantine_ms = 0             # free a fenced node's memory after this long (0: only
//!                               # when it confirms or restarts; docs/cluster.md "Fencing")
//! membership = "etcd://10.0.0.9:2379/shoal/demo"  # optional: which of the nodes below are
//!                               # members now is kept in etcd (docs/cluster.md "Membership")
//! membership_ttl_ms = 3000      # a member that stops renewing its etcd lease this long is gone
//! membership_grace_ms = 0       # ... and leaves the view this much later
//! max_nodes = 64                # with a membership: node ids are below this
//!
//! [[node]]
//! id = 0
//! host = "alpha"                # the machine it runs on; default: rpc's host part
//!                               # (every loopback address counts as "localhost")
//! rpc = "alpha:7700"            # where peers dial its peer RPC (gRPC): IP or host name
//! data = "alpha:7701"           # bulk data channel (network mode); default: rpc port + 1
//! listen = "0.0.0.0:7700"       # where it binds its peer RPC; default: rpc
//! data_listen = "0.0.0.0:7701"  # where it binds its data channel; default: listen's
//!                               # host with data's port, else data
//! socket = "/tmp/shoal/n0.sock" # the node's local client socket
//! region = "/dev/shm/shoal-demo-n0"
//! region_size = "256MiB"
//! access = "mapped"             # how other nodes reach this region: mapped (every
//!                               # node maps it) | host (the nodes of its host map it,
//!                               # the others pull) | network (every other node pulls)
//! public_key = "64 hex digits"  # optional, on every node or none: per-node identities
//! key_file = "/etc/shoal/node.key"  # this node's private key (where it runs)
//!
//! [node.elastic]                # optional: the store's capacity follows free memory
//! threshold = 0.95              # r_0; also interval_ms, urgent_interval_ms, gain, min_capacity,
//!                               # max_fraction, source, pressure_file, psi,
//!                               # shrink_gain, feed_forward, prefetch (bytes; 0 = off)
//! ```
//!
//! Paths (socket, region, burst, key_file) name things on the host a node
//! runs on, so they must differ only between nodes that share a host: one
//! file serves every host. A `mapped` region is mapped by every node at its
//! path, so its path is taken on every host.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::membership_url::MembershipUrl;
use serde::Deserialize;
use shoal_core::coherence::CoherenceMode;
use shoal_core::error::{Result, ShoalError};
use shoal_core::units::parse_size;

pub use crate::address::Address;

/// How other nodes reach a node's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Every node maps the region at its path (CXL devdax, ThymesisFlow, a
    /// memory fabric shared by the hosts; /dev/shm when every node runs on
    /// one host).
    Mapped,
    /// The nodes on the same host map it (/dev/shm); nodes on other hosts
    /// pull its objects over the network. A mixed deployment: several nodes
    /// per host, several hosts.
    Host,
    /// Only over the network: every other node pulls its objects and keeps
    /// copies.
    Network,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Mapped => "mapped",
            Access::Host => "host",
            Access::Network => "network",
        }
    }
}

impl std::str::FromStr for Access {
    type Err = ShoalError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mapped" => Ok(Access::Mapped),
            "host" => Ok(Access::Host),
            "network" => Ok(Access::Network),
            other => Err(ShoalError::invalid(format!(
                "access mode {other:?} is not \"mapped\", \"host\" or \"network\""
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub id: u32,
    /// The machine the node runs on (`host`); `None`: the host part of its
    /// rpc address ([`Node::host`]).
    pub host: Option<String>,
    /// Where peers dial its peer RPC.
    pub rpc: Address,
    /// The bulk data channel (`bulk`): where network-mode pulls fetch bytes.
    pub data: Address,
    /// Where it binds its peer RPC (`listen`, e.g. 0.0.0.0:7700); `None`: rpc.
    pub listen: Option<Address>,
    /// Where it binds its data channel (`data_listen`); `None`: listen's
    /// host with data's port, or data.
    pub data_listen: Option<Address>,
    pub socket: PathBuf,
    pub region: PathBuf,
    pub region_size: u64,
    pub access: Access,
    /// Where the node serves `/metrics` and its status page (HTTP); `None`: nowhere.
    pub metrics: Option<SocketAddr>,
    /// The node's tiers below memory (all optional: none = memory only).
    pub tiers: NodeTiers,
    /// The elastic capacity controller (`[node.elastic]`); `None`: a static store.
    pub elastic: Option<NodeElastic>,
    /// The node's own identity (`public_key`, `key_file`); `None`: the
    /// cluster authenticates with its shared token only.
    pub identity: Option<NodeIdentity>,
    /// Its TLS certificate and key (`tls_cert`, `tls_key`): on every node
    /// when the cluster has `tls_ca`.
    pub tls: Option<NodeTls>,
}

impl Node {
    /// The host the node runs on: `host` as the file gives it, else the host
    /// part of its rpc address, every loopback address (127.0.0.0/8, ::1,
    /// localhost) counting as one host, "localhost". Nodes with the same host
    /// share a file system (their paths must differ) and, with access =
    /// "host", map each other's regions.
    pub fn host(&self) -> String {
        match &self.host {
            Some(host) => host.clone(),
            None if self.rpc.is_loopback() => "localhost".into(),
            None => self.rpc.host(),
        }
    }

    /// Where the node binds its peer RPC.
    pub fn listen_address(&self) -> &Address {
        self.listen.as_ref().unwrap_or(&self.rpc)
    }

    /// Where the node binds its data channel.
    pub fn data_listen_address(&self) -> Address {
        match (&self.data_listen, &self.listen) {
            (Some(address), _) => address.clone(),
            (None, Some(listen)) => listen.with_port(self.data.port()),
            (None, None) => self.data.clone(),
        }
    }
}

/// A node's public key and where the node keeps its private key
/// (`node_keys`). On every node of a cluster or on none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub public_key: [u8; 32],
    /// Read only by the node itself (and by the command line where it
    /// speaks as that node); relative paths are from the cluster file.
    pub key_file: PathBuf,
}

/// A node's `[node.elastic]` table: each setting optional (the daemon's
/// defaults are DynIMS' parameters), `shoal serve` flags override each.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeElastic {
    /// false turns the controller off (a table kept for later).
    pub enabled: bool,
    pub interval_ms: Option<u64>,
    /// The interval while a burst is met; 0: every step T apart.
    pub urgent_interval_ms: Option<u64>,
    /// r_0.
    pub threshold: Option<f64>,
    /// λ.
    pub gain: Option<f64>,
    /// λ for shrinks only.
    pub shrink_gain: Option<f64>,
    /// The law applied to the next step's expected use.
    pub feed_forward: Option<bool>,
    /// U_min in bytes.
    pub min_capacity: Option<u64>,
    /// α: U_max = α·M.
    pub max_fraction: Option<f64>,
    /// auto | host | cgroup:DIR | meminfo:FILE.
    pub source: Option<String>,
    pub pressure_file: Option<PathBuf>,
    /// Whether the pressure-stall guard acts.
    pub psi: Option<bool>,
    /// Prefetch on growth: bytes of a shrink's victims restored when the
    /// store grows again (0 or absent: off).
    pub prefetch: Option<u64>,
}

/// A node's tier chain as its cluster file gives it (`shoal serve` flags
/// override each setting).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeTiers {
    /// The burst buffer's directory (local, normally NVMe).
    pub burst: Option<PathBuf>,
    pub burst_capacity: Option<u64>,
    /// The backing store: a directory, or `s3://bucket/prefix`.
    pub backing: Option<String>,
    pub backing_capacity: Option<u64>,
    /// The node's default durability: memory, local or backing.
    pub durability: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub name: String,
    pub token: String,
    pub coherence: CoherenceMode,
    /// Emulation of a non-coherent fabric on one host: clients read and write
    /// private copies of the regions ("caches") that only flush and
    /// invalidate synchronise. Needs `coherence = "noncoherent"`.
    pub simulate_caches: bool,
    pub heartbeat: Duration,
    pub lease: Duration,
    /// How long a node keeps the reference its get took at an owner after
    /// its clients released it (a loan), so a repeated get needs no round
    /// trip. Zero: every remote reference is returned on release.
    pub linger: Duration,
    /// How long an owner keeps what a fenced node held quarantined before
    /// freeing it unconfirmed; `None`: until the node confirms or restarts.
    pub quarantine: Option<Duration>,
    /// Where the members are kept when they are not all of `nodes`: with
    /// it, `nodes` are the nodes that may be members, and etcd says which
    /// are now (docs/cluster.md, "Membership").
    pub membership: Option<MembershipConfig>,
    /// Peer traffic over TLS 1.3 with certificates of the cluster's CA
    /// (`tls_ca`, `tls_crl`); `None`: cleartext, allowed only on loopback
    /// addresses or with `insecure_cleartext` (docs/security.md).
    pub tls: Option<TlsTrust>,
    /// `insecure_cleartext = true`: cleartext between hosts on purpose (a
    /// private fabric), logged at start.
    pub insecure_cleartext: bool,
    pub nodes: Vec<Node>,
}

/// What a node trusts when peers present certificates: the cluster CA's
/// certificates (several during a rotation) and the revoked ones. Both
/// files are read again when they change, so a rotation or a revocation
/// needs no restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsTrust {
    /// PEM: one or more CA certificates.
    pub ca: PathBuf,
    /// PEM: certificate revocation lists signed by the CA.
    pub crl: Option<PathBuf>,
}

/// A node's TLS certificate and private key (PEM), read by that node only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The `[cluster]` keys of a membership kept in etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipConfig {
    pub url: MembershipUrl,
    /// A member whose etcd lease is not renewed this long loses its
    /// liveness key (whole seconds, at least 1: etcd's unit).
    pub ttl: Duration,
    /// How long a member may be without its liveness key before it leaves
    /// the view (a restart within it keeps its place).
    pub grace: Duration,
    /// Node ids are below this: what every member's per-node tables are
    /// sized by, since nodes absent from the file join at run time.
    pub max_nodes: u32,
}

/// `max_nodes` when the file does not say.
pub const DEFAULT_MAX_NODES: u32 = 64;

/// The most `max_nodes` may be: peer principals are numbered below 2^27
/// (the daemon's `principals`), and every member keeps a few words per slot.
pub const MAX_NODES_LIMIT: u32 = 4096;

impl MembershipConfig {
    /// The membership at `url` with the file's defaults: a TTL of 3 s, no
    /// grace.
    pub fn new(url: MembershipUrl) -> Self {
        Self {
            url,
            ttl: Duration::from_millis(default_membership_ttl()),
            grace: Duration::ZERO,
            max_nodes: DEFAULT_MAX_NODES,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileRepr {
    pub(crate) cluster: toml::Table,
    #[serde(default)]
    pub(crate) node: Vec<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterRepr {
    name: String,
    token: Option<String>,
    token_file: Option<PathBuf>,
    #[serde(default = "default_coherence")]
    coherence: String,
    #[serde(default)]
    simulate_caches: bool,
    #[serde(default = "default_heartbeat")]
    heartbeat_ms: u64,
    #[serde(default = "default_lease")]
    lease_ms: u64,
    #[serde(default = "default_linger")]
    linger_ms: u64,
    #[serde(default)]
    quarantine_ms: u64,
    membership: Option<String>,
    #[serde(default = "default_membership_ttl")]
    membership_ttl_ms: u64,
    #[serde(default)]
    membership_grace_ms: u64,
    max_nodes: Option<u32>,
    tls_ca: Option<PathBuf>,
    tls_crl: Option<PathBuf>,
    #[serde(default)]
    insecure_cleartext: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeRepr {
    id: u32,
    host: Option<String>,
    rpc: String,
    data: Option<String>,
    listen: Option<String>,
    data_listen: Option<String>,
    socket: PathBuf,
    region: PathBuf,
    region_size: SizeRepr,
    #[serde(default = "default_access")]
    access: String,
    burst: Option<PathBuf>,
    burst_capacity: Option<SizeRepr>,
    backing: Option<String>,
    backing_capacity: Option<SizeRepr>,
    durability: Option<String>,
    metrics: Option<String>,
    elastic: Option<ElasticRepr>,
    public_key: Option<String>,
    key_file: Option<PathBuf>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ElasticRepr {
    #[serde(default = "enabled")]
    enabled: bool,
    interval_ms: Option<u64>,
    urgent_interval_ms: Option<u64>,
    threshold: Option<f64>,
    gain: Option<f64>,
    shrink_gain: Option<f64>,
    feed_forward: Option<bool>,
    min_capacity: Option<SizeRepr>,
    max_fraction: Option<f64>,
    source: Option<String>,
    pressure_file: Option<PathBuf>,
    psi: Option<bool>,
    prefetch: Option<SizeRepr>,
}

fn enabled() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Bytes(u64),
    Text(String),
}

fn default_coherence() -> String {
    "coherent".into()
}
fn default_heartbeat() -> u64 {
    200
}
fn default_lease() -> u64 {
    2000
}
fn default_linger() -> u64 {
    1000
}
fn default_membership_ttl() -> u64 {
    3000
}
fn default_access() -> String {
    "mapped".into()
}

/// What checking a cluster file found: the topology if it is valid, every
/// error (each names the node, or `[cluster]`, and the key), and warnings
/// (valid but probably not meant: `check::warnings`).
#[derive(Debug)]
pub struct Checked {
    pub topology: Option<Topology>,
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
}

/// The `[cluster]` table, and whether its token was written in the file.
pub(crate) struct ClusterPart {
    pub(crate) name: String,
    pub(crate) token: String,
    pub(crate) token_inline: bool,
    pub(crate) coherence: CoherenceMode,
    pub(crate) simulate_caches: bool,
    pub(crate) heartbeat: Duration,
    pub(crate) lease: Duration,
    pub(crate) linger: Duration,
    pub(crate) quarantine: Option<Duration>,
    pub(crate) membership: Option<MembershipConfig>,
    pub(crate) tls: Option<TlsTrust>,
    pub(crate) insecure_cleartext: bool,
}

/// `path` as the file means it: relative to the file's directory.
fn from_file(base: Option<&Path>, path: PathBuf) -> PathBuf {
    match base {
        Some(b) if path.is_relative() => b.join(path),
        _ => path,
    }
}

pub(crate) fn cluster_part(
    table: toml::Table,
    base: Option<&Path>,
    errors: &mut Vec<String>,
) -> Option<ClusterPart> {
    let repr: ClusterRepr = match toml::Value::Table(table).try_into() {
        Ok(repr) => repr,
        Err(e) => {
            errors.push(format!("[cluster]: {}", e.message()));
            return None;
        }
    };
    let coherence = match repr.coherence.parse() {
        Ok(mode) => Some(mode),
        Err(e) => {
            errors.push(format!("[cluster] coherence: {}", ShoalError::message(&e)));
            None
        }
    };
    let token_inline = repr.token.is_some();
    let token = match (repr.token, repr.token_file) {
        (Some(token), None) => Some(token),
        (None, Some(path)) => {
            let path = base.map_or(path.clone(), |b| b.join(&path));
            match std::fs::read_to_string(&path) {
                Ok(text) => Some(text.trim().to_owned()),
                Err(e) => {
                    errors.push(format!(
                        "[cluster] token_file: read {}: {e}",
                        path.display()
                    ));
                    None
                }
            }
        }
        _ => {
            errors.push("[cluster] needs exactly one of token or token_file".into());
            None
        }
    };
    let membership = match repr.membership.as_deref().map(str::parse::<MembershipUrl>) {
        None => None,
        Some(Ok(url)) => {
            if repr.membership_ttl_ms < 1000 || !repr.membership_ttl_ms.is_multiple_of(1000) {
                errors.push(format!(
                    "[cluster] membership_ttl_ms: {} is not whole seconds of at least 1 (etcd's \
                     leases count seconds)",
                    repr.membership_ttl_ms
                ));
            }
            let max_nodes = repr.max_nodes.unwrap_or(DEFAULT_MAX_NODES);
            if max_nodes == 0 || max_nodes > MAX_NODES_LIMIT {
                errors.push(format!(
                    "[cluster] max_nodes: {max_nodes} is not in 1..={MAX_NODES_LIMIT}"
                ));
            }
            Some(MembershipConfig {
                url,
                ttl: Duration::from_millis(repr.membership_ttl_ms),
                grace: Duration::from_millis(repr.membership_grace_ms),
                max_nodes,
            })
        }
        Some(Err(e)) => {
            errors.push(format!("[cluster] membership: {}", ShoalError::message(&e)));
            None
        }
    };
    if repr.max_nodes.is_some() && repr.membership.is_none() {
        errors.push(
            "[cluster] max_nodes needs membership: a static file's nodes are all the nodes".into(),
        );
    }
    if repr.tls_crl.is_some() && repr.tls_ca.is_none() {
        errors.push("[cluster] tls_crl needs tls_ca: revoked by which CA?".into());
    }
    if repr.tls_ca.is_some() && repr.insecure_cleartext {
        errors.push(
            "[cluster] tls_ca and insecure_cleartext = true contradict each other: pick one".into(),
        );
    }
    let tls = repr.tls_ca.map(|ca| TlsTrust {
        ca: from_file(base, ca),
        crl: repr.tls_crl.map(|crl| from_file(base, crl)),
    });
    if token.as_ref().is_some_and(String::is_empty) {
        errors.push(format!(
            "[cluster] {}: the cluster token is empty",
            if token_inline { "token" } else { "token_file" }
        ));
    }
    Some(ClusterPart {
        name: repr.name,
        token: token.filter(|t| !t.is_empty())?,
        token_inline,
        coherence: coherence?,
        simulate_caches: repr.simulate_caches,
        heartbeat: Duration::from_millis(repr.heartbeat_ms),
        lease: Duration::from_millis(repr.lease_ms),
        linger: Duration::from_millis(repr.linger_ms),
        quarantine: (repr.quarantine_ms > 0).then(|| Duration::from_millis(repr.quarantine_ms)),
        membership,
        tls,
        insecure_cleartext: repr.insecure_cleartext,
    })
}

/// The errors of one `[[node]]` table, each prefixed with the node.
struct NodeProblems<'a> {
    who: String,
    errors: &'a mut Vec<String>,
    found: bool,
}

impl NodeProblems<'_> {
    fn fail(&mut self, message: impl std::fmt::Display) {
        self.errors.push(format!("{}: {message}", self.who));
        self.found = true;
    }

    fn size(&mut self, key: &str, repr: Option<SizeRepr>) -> Option<u64> {
        match repr? {
            SizeRepr::Bytes(b) => Some(b),
            SizeRepr::Text(t) => match parse_size(&t) {
                Ok(bytes) => Some(bytes),
                Err(e) => {
                    self.fail(format_args!("{key} {t:?}: {e}"));
                    None
                }
            },
        }
    }

    fn address(&mut self, key: &str, text: Option<&str>) -> Option<Address> {
        let text = text?;
        match Address::parse(text) {
            Ok(address) => Some(address),
            Err(e) => {
                self.fail(format_args!("{key} address {text:?}: {e}"));
                None
            }
        }
    }
}

/// One `[[node]]` table; every problem goes to `errors`, named "node ID:"
/// (or by its place in the file when it has no id).
pub(crate) fn node_part(
    place: usize,
    table: toml::Table,
    base: Option<&Path>,
    errors: &mut Vec<String>,
) -> Option<Node> {
    let who = match table.get("id").and_then(toml::Value::as_integer) {
        Some(id) => format!("node {id}"),
        None => format!("[[node]] number {} (from the top)", place + 1),
    };
    let n: NodeRepr = match toml::Value::Table(table).try_into() {
        Ok(repr) => repr,
        Err(e) => {
            errors.push(format!("{who}: {}", e.message()));
            return None;
        }
    };
    let mut p = NodeProblems {
        who,
        errors,
        found: false,
    };
    let region_size = p.size("region_size", Some(n.region_size));
    let tiers = NodeTiers {
        burst: n.burst,
        burst_capacity: p.size("burst_capacity", n.burst_capacity),
        backing: n.backing,
        backing_capacity: p.size("backing_capacity", n.backing_capacity),
        durability: n.durability,
    };
    let elastic = n.elastic.map(|e| NodeElastic {
        enabled: e.enabled,
        interval_ms: e.interval_ms,
        urgent_interval_ms: e.urgent_interval_ms,
        threshold: e.threshold,
        gain: e.gain,
        shrink_gain: e.shrink_gain,
        feed_forward: e.feed_forward,
        min_capacity: p.size("elastic.min_capacity", e.min_capacity),
        max_fraction: e.max_fraction,
        source: e.source,
        pressure_file: e.pressure_file,
        psi: e.psi,
        prefetch: p.size("elastic.prefetch", e.prefetch),
    });
    let rpc = p.address("rpc", Some(&n.rpc));
    let listen = p.address("listen", n.listen.as_deref());
    let data_listen = p.address("data_listen", n.data_listen.as_deref());
    let data = match (&n.data, &rpc) {
        (Some(text), _) => p.address("data", Some(text)),
        (None, Some(rpc)) => match rpc.port().checked_add(1) {
            Some(port) => Some(rpc.with_port(port)),
            None => {
                p.fail(format_args!(
                    "rpc port {} leaves no default data port; set data",
                    rpc.port()
                ));
                None
            }
        },
        (None, None) => None,
    };
    // Where to bind an HTTP server, like --metrics-addr: an IP address.
    let metrics = match n.metrics.as_deref() {
        None => None,
        Some(text) => match text.parse::<SocketAddr>() {
            Ok(addr) => Some(addr),
            Err(e) => {
                p.fail(format_args!(
                    "metrics address {text:?}: {e} (an IP address and a port to listen on)"
                ));
                None
            }
        },
    };
    let host = match n.host {
        Some(host) if host.trim().is_empty() => {
            p.fail("host is empty: name the machine the node runs on, or leave host out");
            None
        }
        host => host.map(|h| h.trim().to_ascii_lowercase()),
    };
    let access = match n.access.parse::<Access>() {
        Ok(access) => Some(access),
        Err(e) => {
            p.fail(format_args!("access: {}", e.message()));
            None
        }
    };
    let identity = match (n.public_key, n.key_file) {
        (None, None) => None,
        (Some(hex), Some(key_file)) => match crate::node_keys::from_hex(&hex) {
            Some(public_key) => Some(NodeIdentity {
                public_key,
                key_file: from_file(base, key_file),
            }),
            None => {
                p.fail("public_key is not 64 hex digits");
                None
            }
        },
        _ => {
            p.fail("public_key and key_file go together");
            None
        }
    };
    let tls = match (n.tls_cert, n.tls_key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some(NodeTls {
            cert: from_file(base, cert),
            key: from_file(base, key),
        }),
        _ => {
            p.fail("tls_cert and tls_key go together");
            None
        }
    };
    if p.found {
        return None;
    }
    Some(Node {
        id: n.id,
        host,
        rpc: rpc?,
        data: data?,
        listen,
        data_listen,
        socket: n.socket,
        region: n.region,
        region_size: region_size?,
        access: access?,
        tiers,
        metrics,
        elastic,
        identity,
        tls,
    })
}

impl Topology {
    /// Reads and validates a cluster file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ShoalError::io(&format!("read cluster file {}", path.display()), e))?;
        Self::parse(&text, path.parent())
            .map_err(|e| ShoalError::invalid(format!("{}: {}", path.display(), e.message())))
    }

    /// Whether nodes `a` and `b` run on one host (the same [`Node::host`]).
    pub fn shares_host(&self, a: u32, b: u32) -> bool {
        match (self.node(a), self.node(b)) {
            (Ok(a), Ok(b)) => a.host() == b.host(),
            _ => false,
        }
    }

    /// Whether node `reader` (its daemon and its clients) maps `owner`'s
    /// region, rather than pulling its objects over the network.
    pub fn maps(&self, reader: u32, owner: u32) -> bool {
        match self.node(owner).map(|n| n.access) {
            Ok(Access::Mapped) => true,
            Ok(Access::Host) => self.shares_host(reader, owner),
            Ok(Access::Network) | Err(_) => false,
        }
    }

    /// Node `id` as this file (or, at run time, the membership) describes it.
    pub fn node(&self, id: u32) -> Result<&Node> {
        match self.nodes.binary_search_by_key(&id, |n| n.id) {
            Ok(at) => Ok(&self.nodes[at]),
            Err(_) if self.membership.is_some() => Err(ShoalError::invalid(format!(
                "node {id} is not known here: not in cluster {:?}'s file, and not (yet) a member \
                 whose record this node read",
                self.name
            ))),
            Err(_) => Err(ShoalError::invalid(format!(
                "node {id} is not in cluster {:?} (nodes 0..{})",
                self.name,
                self.nodes.len()
            ))),
        }
    }

    /// How many node ids there can be: every per-node table is this long.
    /// A static file's nodes are 0..n; with a membership, ids are below
    /// `max_nodes` and nodes absent from the file join at run time.
    pub fn slots(&self) -> usize {
        match &self.membership {
            Some(m) => m.max_nodes as usize,
            None => self.nodes.len(),
        }
    }

    /// The ids of the nodes known here, in order.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.nodes.iter().map(|n| n.id)
    }

    /// Whether nodes authenticate with their own keys (every node has a
    /// `public_key`), not the shared token alone.
    pub fn has_identities(&self) -> bool {
        !self.nodes.is_empty() && self.nodes.iter().all(|n| n.identity.is_some())
    }

    /// What a node joining a membership service brings, so that only nodes
    /// of this cluster with its token and its `max_nodes` share a prefix:
    /// the cluster's name, a digest of its token (never the token itself)
    /// and `max_nodes`.
    pub fn membership_stamp(&self) -> String {
        // Every member sizes its per-node tables by max_nodes and refuses
        // records of ids past it: members must agree on it.
        let slots = self.membership.as_ref().map_or(0, |m| m.max_nodes);
        // And on TLS: a member speaking cleartext to one that requires TLS
        // would be refused on every call.
        let transport = if self.tls.is_some() {
            "tls"
        } else {
            "cleartext"
        };
        format!(
            "{} max_nodes={slots} transport={transport}",
            self.identity()
        )
    }

    /// What tells this cluster from any other: its name and a digest of its
    /// token (never the token itself), `name=… token-sha256=…`. Two
    /// clusters of one name but different tokens differ; clients learn it
    /// from `ClusterInfo` (Dask's workers compare it to hand objects to each
    /// other by id across hosts).
    pub fn identity(&self) -> String {
        let digest = ring::digest::digest(&ring::digest::SHA256, self.token.as_bytes());
        let hex: String = digest.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("name={} token-sha256={hex}", self.name)
    }

    /// Node `id`'s `[[node]]` table as this file would write it: what a
    /// member publishes of itself in a membership service.
    pub fn node_record(&self, id: u32) -> Result<String> {
        let node = self.node(id)?.clone();
        let alone = Self {
            nodes: vec![node],
            membership: None,
            ..self.clone()
        };
        let text = alone.to_toml();
        let start = text.find("[[node]]").unwrap_or(0);
        Ok(text[start..].trim().to_owned())
    }

    /// Nodes sorted by id (what [`Topology::node`] looks them up by; a
    /// parsed file's are, one built by hand may not be).
    pub fn sorted(mut self) -> Self {
        self.nodes.sort_by_key(|n| n.id);
        self
    }

    /// Adds `node` (a member learned from the membership service: checked
    /// by [`Topology::parse_record`]), or replaces the node of its id.
    /// Returns whether anything changed.
    pub fn put_node(&mut self, node: Node) -> bool {
        match self.nodes.binary_search_by_key(&node.id, |n| n.id) {
            Ok(at) if self.nodes[at] == node => false,
            Ok(at) => {
                self.nodes[at] = node;
                true
            }
            Err(at) => {
                self.nodes.insert(at, node);
                true
            }
        }
    }

    /// Writes the cluster file (`shoal cluster up` writes one for its nodes).
    pub fn to_toml(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "[cluster]\nname = {:?}\ntoken = {:?}\ncoherence = \"{}\"\nsimulate_caches = {}\nheartbeat_ms = {}\nlease_ms = {}\nlinger_ms = {}",
            self.name,
            self.token,
            self.coherence,
            self.simulate_caches,
            self.heartbeat.as_millis(),
            self.lease.as_millis(),
            self.linger.as_millis()
        );
        if let Some(quarantine) = self.quarantine {
            let _ = writeln!(out, "quarantine_ms = {}", quarantine.as_millis());
        }
        if let Some(m) = &self.membership {
            let _ = writeln!(
                out,
                "membership = \"{}\"\nmembership_ttl_ms = {}\nmembership_grace_ms = {}\nmax_nodes = {}",
                m.url,
                m.ttl.as_millis(),
                m.grace.as_millis(),
                m.max_nodes
            );
        }
        if let Some(tls) = &self.tls {
            let _ = writeln!(out, "tls_ca = {:?}", tls.ca.display().to_string());
            if let Some(crl) = &tls.crl {
                let _ = writeln!(out, "tls_crl = {:?}", crl.display().to_string());
            }
        }
        if self.insecure_cleartext {
            let _ = writeln!(out, "insecure_cleartext = true");
        }
        for n in &self.nodes {
            let _ = writeln!(
                out,
                "\n[[node]]\nid = {}\nrpc = \"{}\"\ndata = \"{}\"\nsocket = {:?}\nregion = {:?}\nregion_size = {}\naccess = \"{}\"",
                n.id,
                n.rpc,
                n.data,
                n.socket.display().to_string(),
                n.region.display().to_string(),
                n.region_size,
                n.access.as_str()
            );
            if let Some(host) = &n.host {
                let _ = writeln!(out, "host = {host:?}");
            }
            if let Some(listen) = &n.listen {
                let _ = writeln!(out, "listen = \"{listen}\"");
            }
            if let Some(listen) = &n.data_listen {
                let _ = writeln!(out, "data_listen = \"{listen}\"");
            }
            let t = &n.tiers;
            if let Some(dir) = &t.burst {
                let _ = writeln!(out, "burst = {:?}", dir.display().to_string());
            }
            if let Some(bytes) = t.burst_capacity {
                let _ = writeln!(out, "burst_capacity = {bytes}");
            }
            if let Some(backing) = &t.backing {
                let _ = writeln!(out, "backing = {backing:?}");
            }
            if let Some(bytes) = t.backing_capacity {
                let _ = writeln!(out, "backing_capacity = {bytes}");
            }
            if let Some(level) = &t.durability {
                let _ = writeln!(out, "durability = {level:?}");
            }
            if let Some(metrics) = n.metrics {
                let _ = writeln!(out, "metrics = \"{metrics}\"");
            }
            if let Some(identity) = &n.identity {
                let _ = writeln!(
                    out,
                    "public_key = \"{}\"\nkey_file = {:?}",
                    crate::node_keys::to_hex(&identity.public_key),
                    identity.key_file.display().to_string()
                );
            }
            if let Some(tls) = &n.tls {
                let _ = writeln!(
                    out,
                    "tls_cert = {:?}\ntls_key = {:?}",
                    tls.cert.display().to_string(),
                    tls.key.display().to_string()
                );
            }
            if let Some(e) = &n.elastic {
                // A sub-table: after every key of the node.
                let _ = writeln!(out, "\n[node.elastic]\nenabled = {}", e.enabled);
                let numbers = [
                    ("interval_ms", e.interval_ms.map(|v| v.to_string())),
                    (
                        "urgent_interval_ms",
                        e.urgent_interval_ms.map(|v| v.to_string()),
                    ),
                    ("threshold", e.threshold.map(|v| format!("{v:?}"))),
                    ("gain", e.gain.map(|v| format!("{v:?}"))),
                    ("shrink_gain", e.shrink_gain.map(|v| format!("{v:?}"))),
                    ("feed_forward", e.feed_forward.map(|v| v.to_string())),
                    ("min_capacity", e.min_capacity.map(|v| v.to_string())),
                    ("max_fraction", e.max_fraction.map(|v| format!("{v:?}"))),
                    ("psi", e.psi.map(|v| v.to_string())),
                    ("prefetch", e.prefetch.map(|v| v.to_string())),
                ];
                for (key, value) in numbers {
                    if let Some(value) = value {
                        let _ = writeln!(out, "{key} = {value}");
                    }
                }
                if let Some(source) = &e.source {
                    let _ = writeln!(out, "source = {source:?}");
                }
                if let Some(path) = &e.pressure_file {
                    let _ = writeln!(out, "pressure_file = {:?}", path.display().to_string());
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[cluster]
name = "demo"
token = "t0ken"
coherence = "noncoherent"
quarantine_ms = 30000

[[node]]
id = 1
rpc = "127.0.0.1:7710"
data = "127.0.0.1:7720"
socket = "/tmp/x/n1.sock"
region = "/dev/shm/demo-n1"
region_size = "64MiB"
access = "network"
burst = "/nvme/demo-n1"
burst_capacity = "2GiB"
backing = "s3://bucket/demo/n1"
durability = "local"
metrics = "127.0.0.1:9100"

[node.elastic]
threshold = 0.9
min_capacity = "16MiB"
source = "meminfo:/tmp/fake-meminfo"
psi = false
prefetch = "256MiB"
shrink_gain = 1.0
feed_forward = true
urgent_interval_ms = 10

[[node]]
id = 0
rpc = "127.0.0.1:7700"
socket = "/tmp/x/n0.sock"
region = "/dev/shm/demo-n0"
region_size = 1048576
"#;

    #[test]
    fn parses_validates_and_round_trips() {
        let t = Topology::parse(FILE, None).unwrap().sorted();
        assert_eq!(t.nodes.len(), 2);
        assert_eq!(t.coherence, CoherenceMode::Noncoherent);
        assert_eq!(t.node(0).unwrap().access, Access::Mapped);
        assert_eq!(t.node(1).unwrap().access, Access::Network);
        assert_eq!(t.node(1).unwrap().region_size, 64 << 20);
        assert_eq!(t.node(1).unwrap().tiers.burst_capacity, Some(2 << 30));
        assert_eq!(
            t.node(1).unwrap().tiers.backing.as_deref(),
            Some("s3://bucket/demo/n1")
        );
        assert_eq!(t.node(0).unwrap().tiers, NodeTiers::default());
        assert_eq!(t.heartbeat, Duration::from_millis(200));
        assert_eq!(t.quarantine, Some(Duration::from_secs(30)));
        assert_eq!(t.node(0).unwrap().data, "127.0.0.1:7701".parse().unwrap());
        assert_eq!(t.node(1).unwrap().data, "127.0.0.1:7720".parse().unwrap());
        assert_eq!(t.node(0).unwrap().metrics, None);
        assert_eq!(
            t.node(1).unwrap().metrics,
            Some("127.0.0.1:9100".parse().unwrap())
        );
        let elastic = t.node(1).unwrap().elastic.clone().unwrap();
        assert!(elastic.enabled);
        assert_eq!(elastic.threshold, Some(0.9));
        assert_eq!(elastic.min_capacity, Some(16 << 20));
        assert_eq!(elastic.source.as_deref(), Some("meminfo:/tmp/fake-meminfo"));
        assert_eq!((elastic.psi, elastic.gain), (Some(false), None));
        assert_eq!(elastic.prefetch, Some(256 << 20));
        assert_eq!(elastic.shrink_gain, Some(1.0));
        assert_eq!(elastic.feed_forward, Some(true));
        assert_eq!(elastic.urgent_interval_ms, Some(10));
        assert_eq!(t.node(0).unwrap().elastic, None);
        let again = Topology::parse(&t.to_toml(), None).unwrap();
        assert_eq!(again, t);
        assert!(t.node(2).is_err());
    }

    #[test]
    fn rejects_bad_files_with_a_reason() {
        let cases = [
            (FILE.replace("id = 1", "id = 2"), "no gaps"),
            (FILE.replace("id = 1", "id = 0"), "no gaps"),
            (FILE.replace("token = \"t0ken\"", ""), "token"),
            (FILE.replace("t0ken", ""), "empty"),
            (
                FILE.replace("\"network\"", "\"carrier pigeon\""),
                "access mode",
            ),
            (FILE.replace("noncoherent", "sometimes"), "coheren"),
            (FILE.replace("127.0.0.1:7710", "nowhere"), "rpc address"),
            (FILE.replace("127.0.0.1:7720", "nowhere"), "data address"),
            (FILE.replace("127.0.0.1:9100", "nowhere"), "metrics address"),
            (
                FILE.replace("127.0.0.1:9100", "127.0.0.1:7700"),
                "used by another node",
            ),
            // node 0's default data port (7701) is node 1's rpc port here
            (
                FILE.replace("127.0.0.1:7710", "127.0.0.1:7701"),
                "used by another node",
            ),
            (
                FILE.replace("127.0.0.1:7720", "127.0.0.1:7700"),
                "used by another node",
            ),
            (FILE.replace("demo-n1", "demo-n0"), "used by another node"),
            (FILE.replace("\"64MiB\"", "\"lots\""), "size"),
            (
                FILE.replace("region_size = 1048576", "region_size = 0"),
                "region_size is 0",
            ),
            (
                FILE.replace("[cluster]", "[cluster]\nbogus = 1"),
                "unknown field",
            ),
            (
                FILE.replace(
                    "coherence = \"noncoherent\"",
                    "heartbeat_ms = 500\nlease_ms = 600",
                ),
                "lease_ms",
            ),
        ];
        for (text, why) in cases {
            let err = Topology::parse(&text, None).unwrap_err().to_string();
            assert!(
                err.to_lowercase().contains(&why.to_lowercase()),
                "{why}: {err}"
            );
        }
    }

    #[test]
    fn token_file_is_read_relative_to_the_cluster_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "from-file\n").unwrap();
        let text = FILE.replace("token = \"t0ken\"", "token_file = \"token\"");
        let t = Topology::parse(&text, Some(dir.path())).unwrap();
        assert_eq!(t.token, "from-file");
    }

    #[test]
    fn identities_are_on_every_node_or_none() {
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let with = |n1: &str, n0: &str| {
            FILE.replace(
                "metrics = \"127.0.0.1:9100\"",
                &format!("metrics = \"127.0.0.1:9100\"\n{n1}"),
            )
            .replace(
                "region_size = 1048576",
                &format!("region_size = 1048576\n{n0}"),
            )
        };
        let both = with(
            &format!("public_key = \"{a}\"\nkey_file = \"n1.key\""),
            &format!("public_key = \"{b}\"\nkey_file = \"/etc/shoal/n0.key\""),
        );
        let t = Topology::parse(&both, Some(Path::new("/srv/demo")))
            .unwrap()
            .sorted();
        assert!(t.has_identities());
        let one = t.node(1).unwrap().identity.clone().unwrap();
        assert_eq!(one.public_key, [0xaa; 32]);
        assert_eq!(one.key_file, Path::new("/srv/demo/n1.key"));
        assert_eq!(
            t.node(0).unwrap().identity.as_ref().unwrap().key_file,
            Path::new("/etc/shoal/n0.key")
        );
        assert_eq!(Topology::parse(&t.to_toml(), None).unwrap().sorted(), t);
        assert!(!Topology::parse(FILE, None).unwrap().has_identities());
        for (text, why) in [
            (
                with(&format!("public_key = \"{a}\"\nkey_file = \"k\""), ""),
                "some nodes but not all",
            ),
            (with(&format!("public_key = \"{a}\""), ""), "go together"),
            (
                with(
                    "public_key = \"xyz\"\nkey_file = \"k\"",
                    &format!("public_key = \"{b}\"\nkey_file = \"k0\""),
                ),
                "64 hex digits",
            ),
        ] {
            let err = Topology::parse(&text, None).unwrap_err().to_string();
            assert!(err.contains(why), "{why}: {err}");
        }
    }

    /// What clients compare to know they are in one cluster: the name and a
    /// digest of the token, never the token; another token is another
    /// cluster even under the same name.
    #[test]
    fn identity_tells_clusters_apart_without_the_token() {
        let t = Topology::parse(FILE, None).unwrap();
        let identity = t.identity();
        assert!(
            identity.starts_with("name=demo token-sha256="),
            "{identity}"
        );
        assert!(!identity.contains("t0ken"));
        assert_eq!(identity, Topology::parse(FILE, None).unwrap().identity());
        let other = Topology::parse(&FILE.replace("t0ken", "another"), None).unwrap();
        assert_ne!(identity, other.identity());
        assert!(t.membership_stamp().starts_with(&identity));
    }
}
