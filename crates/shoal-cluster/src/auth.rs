//! Every peer call carries the caller's node id and a credential as gRPC
//! metadata; the server refuses (and logs) calls whose credential is not the
//! one the claimed node must present before any handler runs. The bulk data
//! channel's request header carries the same pair.
//!
//! Two modes ([`PeerIdentity`]):
//! - **per-node identities** (every node of the cluster file has a
//!   `public_key`; `shoal cluster up` makes them): the credential of a call
//!   from i to j is derived from i's and j's keys (`node_keys`), so no member
//!   can speak as another;
//! - **shared token** (older cluster files): the credential is the cluster
//!   token, the same for every member, so any member can claim any node id.

use std::sync::{Arc, RwLock};

use shoal_core::error::{Result, ShoalError};
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::cert_name::node_cert_name;
use crate::epoch::{self, Epoch, EPOCH_HEADER, LINK_HEADER};
use crate::node_keys::NodeKey;
use crate::topology::{Node, Topology};

pub const TOKEN_HEADER: &str = "x-shoal-token";
pub const NODE_HEADER: &str = "x-shoal-node";

/// Who a calling peer is, checked the same way on the gRPC channel (the
/// token and node headers) and on the bulk data channel (its request
/// header): the one place where a peer's claim becomes a node id. Also
/// what this node presents when it calls a peer.
///
/// Clones share one credential table: a node that joins through the
/// membership service ([`PeerIdentity::learn`]) is admitted by every clone,
/// the server's check included.
#[derive(Clone)]
pub struct PeerIdentity {
    me: u32,
    table: Arc<RwLock<CredentialTable>>,
    /// Per-node identities: this node's key, for the credentials of nodes
    /// learned later; `None` in shared-token mode.
    key: Option<Arc<NodeKey>>,
    /// The cluster's name and token (what a per-node credential covers).
    cluster: Arc<(String, String)>,
    /// A daemon's view epoch, carried by its calls and checked on the calls
    /// it answers (`epoch`); `None` for the command line, whose calls carry
    /// none.
    epoch: Option<Epoch>,
}

/// Per node id: what its calls must carry, and what ours to it carry.
/// `None`: a node not known (yet).
struct CredentialTable {
    incoming: Vec<Option<Box<[u8]>>>,
    outgoing: Vec<Option<AsciiMetadataValue>>,
    /// The name its TLS certificate must carry (`cert_name`).
    cert_names: Vec<Option<String>>,
}

/// Why a peer's claim was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    MissingToken,
    /// The credential is not the one the claimed node must present.
    WrongToken,
    /// No node id, or not a number.
    NoNode,
    NotAMember(u32),
    /// A call over TLS claiming another node than the certificate proved.
    NotTheTlsPeer {
        claimed: u32,
        proven: u32,
    },
    /// A TLS node's call that did not arrive over TLS.
    NotOverTls,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MissingToken => write!(f, "missing cluster credential"),
            Self::WrongToken => write!(
                f,
                "wrong cluster token or node credential for the claimed node"
            ),
            Self::NoNode => write!(f, "missing or bad {NODE_HEADER}"),
            Self::NotAMember(node) => write!(f, "node {node} is not a member of this cluster"),
            Self::NotTheTlsPeer { claimed, proven } => write!(
                f,
                "a call claiming node {claimed} over a TLS connection node {proven}'s \
                 certificate opened"
            ),
            Self::NotOverTls => write!(f, "a peer call not over TLS, which this cluster requires"),
        }
    }
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Self {
        let message = refusal.to_string();
        match refusal {
            Refusal::MissingToken
            | Refusal::WrongToken
            | Refusal::NotTheTlsPeer { .. }
            | Refusal::NotOverTls => Status::unauthenticated(message),
            Refusal::NoNode => Status::invalid_argument(message),
            Refusal::NotAMember(_) => Status::permission_denied(message),
        }
    }
}

/// The node a TLS connection's certificate proved (the connection's
/// information, in every request's extensions: `tls::rpc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsPeer {
    pub node: u32,
    pub remote: Option<std::net::SocketAddr>,
}

/// The node a call was verified to come from, put in the request's
/// extensions by the gRPC check for the handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedPeer(pub u32);

fn ascii(text: &str) -> Result<AsciiMetadataValue> {
    AsciiMetadataValue::try_from(text)
        .map_err(|_| ShoalError::invalid("the cluster token must be printable ASCII"))
}

fn public_key(node: &Node) -> Result<[u8; 32]> {
    node.identity
        .as_ref()
        .map(|i| i.public_key)
        .ok_or_else(|| ShoalError::invalid(format!("node {} has no public_key", node.id)))
}

impl PeerIdentity {
    /// Shared-token mode for node `me` among node ids below `slots`: every
    /// member presents `token`, so the node id a caller claims is not proven.
    pub fn shared(token: &str, slots: u32, me: u32) -> Result<Self> {
        let value = ascii(token)?;
        Ok(Self {
            me,
            table: Arc::new(RwLock::new(CredentialTable {
                incoming: (0..slots).map(|_| Some(token.as_bytes().into())).collect(),
                outgoing: (0..slots).map(|_| Some(value.clone())).collect(),
                cert_names: (0..slots)
                    .map(|id| Some(node_cert_name(id, None)))
                    .collect(),
            })),
            key: None,
            cluster: Arc::new((String::new(), token.to_owned())),
            epoch: None,
        })
    }

    /// Node `me` of `topology`: with per-node identities, its private key is
    /// read from its `key_file` (and must match its `public_key`).
    pub fn for_node(topology: &Topology, me: u32) -> Result<Self> {
        match &topology.node(me)?.identity {
            Some(identity) => Self::with_key(topology, me, NodeKey::load(&identity.key_file)?),
            None => Self::shared(&topology.token, topology.slots() as u32, me),
        }
    }

    /// Node `me` of a cluster with per-node identities, holding `key`.
    pub fn with_key(topology: &Topology, me: u32, key: NodeKey) -> Result<Self> {
        if public_key(topology.node(me)?)? != key.public() {
            return Err(ShoalError::new(
                shoal_core::error::ErrorKind::PermissionDenied,
                format!(
                    "the key given for node {me} is not node {me}'s: its public key differs from the cluster file's"
                ),
            ));
        }
        let slots = topology.slots();
        let identity = Self {
            me,
            table: Arc::new(RwLock::new(CredentialTable {
                incoming: vec![None; slots],
                outgoing: vec![None; slots],
                cert_names: vec![None; slots],
            })),
            key: Some(Arc::new(key)),
            cluster: Arc::new((topology.name.clone(), topology.token.clone())),
            epoch: None,
        };
        for node in &topology.nodes {
            identity.learn(node)?;
        }
        Ok(identity)
    }

    /// Admits `node` (a member learned from the membership service, or one
    /// whose record changed): with per-node identities, the credentials
    /// between it and this node are derived from its public key; in
    /// shared-token mode every node below the slots is admitted already.
    pub fn learn(&self, node: &Node) -> Result<()> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        let peer = public_key(node)?;
        let (name, token) = &*self.cluster;
        let credential = |from, to| key.credential(&peer, name, token, from, to);
        let incoming = credential(node.id, self.me)?
            .into_bytes()
            .into_boxed_slice();
        let outgoing = ascii(&credential(self.me, node.id)?)?;
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let slot = node.id as usize;
        if slot >= table.incoming.len() {
            return Err(ShoalError::invalid(format!(
                "node {} is past the cluster's {} node slots",
                node.id,
                table.incoming.len()
            )));
        }
        table.incoming[slot] = Some(incoming);
        table.outgoing[slot] = Some(outgoing);
        table.cert_names[slot] = Some(node_cert_name(node.id, Some(&peer)));
        Ok(())
    }

    /// The name node `id`'s TLS certificate must carry; `None`: a node
    /// not known (yet).
    pub fn cert_name(&self, id: u32) -> Option<String> {
        self.table().cert_names.get(id as usize).cloned().flatten()
    }

    /// The known node whose certificate name `carries` accepts (a
    /// certificate is checked against each: at most `max_nodes`).
    pub fn node_by_cert_name(&self, carries: impl Fn(&str) -> bool) -> Option<u32> {
        let table = self.table();
        table
            .cert_names
            .iter()
            .position(|name| name.as_deref().is_some_and(&carries))
            .map(|id| id as u32)
    }

    /// For the command line, which speaks as a node: the first node whose
    /// key file can be read here (node 0 with the shared token).
    pub fn for_command_line(topology: &Topology) -> Result<Self> {
        if !topology.has_identities() {
            let first = topology.ids().next().unwrap_or(0);
            return Self::shared(&topology.token, topology.slots() as u32, first);
        }
        let mut last = None;
        for node in &topology.nodes {
            match Self::for_node(topology, node.id) {
                Ok(identity) => return Ok(identity),
                Err(err) => last = Some(err),
            }
        }
        Err(ShoalError::new(
            shoal_core::error::ErrorKind::PermissionDenied,
            format!(
                "no node's key file can be read here (the command line speaks to peers as a node): {}",
                last.map_or_else(String::new, |e| e.to_string())
            ),
        ))
    }

    /// This node.
    pub fn me(&self) -> u32 {
        self.me
    }

    /// This identity as a daemon's: its calls carry `epoch` and the calls
    /// it answers are checked against it ([`crate::epoch`]).
    pub fn with_epoch(mut self, epoch: Epoch) -> Self {
        self.epoch = Some(epoch);
        self
    }

    /// The view epoch this identity carries, if it is a daemon's.
    pub fn epoch(&self) -> Option<&Epoch> {
        self.epoch.as_ref()
    }

    /// Whether callers prove their node id (per-node identities).
    pub fn per_node(&self) -> bool {
        self.key.is_some()
    }

    fn table(&self) -> std::sync::RwLockReadGuard<'_, CredentialTable> {
        self.table.read().unwrap_or_else(|e| e.into_inner())
    }

    /// A caller offering `token` and claiming to be node `claimed`.
    pub fn verify(&self, token: Option<&[u8]>, claimed: Option<u32>) -> Result<u32, Refusal> {
        let token = token.ok_or(Refusal::MissingToken)?;
        let node = claimed.ok_or(Refusal::NoNode)?;
        let table = self.table();
        let expected = table
            .incoming
            .get(node as usize)
            .and_then(Option::as_ref)
            .ok_or(Refusal::NotAMember(node))?;
        if same(token, expected) {
            Ok(node)
        } else {
            Err(Refusal::WrongToken)
        }
    }

    fn outgoing(&self, to: u32) -> Result<AsciiMetadataValue> {
        self.table()
            .outgoing
            .get(to as usize)
            .cloned()
            .flatten()
            .ok_or_else(|| ShoalError::invalid(format!("node {to} is not a member")))
    }

    /// The credential this node presents to node `to` (bulk channel).
    pub fn token_for(&self, to: u32) -> Result<Vec<u8>> {
        Ok(self.outgoing(to)?.as_bytes().to_vec())
    }

    /// The gRPC interceptor for this node's calls to node `to`.
    pub fn credentials(&self, to: u32) -> Result<Credentials> {
        Ok(Credentials {
            token: self.outgoing(to)?,
            node: AsciiMetadataValue::from(self.me),
            epoch: self.epoch.clone(),
        })
    }
}

/// Server side: checks every incoming call before any handler runs, and
/// hands the handlers the verified node ([`VerifiedPeer`]).
#[derive(Clone)]
pub struct TokenCheck {
    identity: PeerIdentity,
    /// Calls must come over TLS, from the node whose certificate opened
    /// the connection ([`TlsPeer`]).
    tls: bool,
}

impl TokenCheck {
    pub fn new(identity: PeerIdentity) -> Self {
        Self {
            identity,
            tls: false,
        }
    }

    /// Also refuses a call whose claimed node is not the one its TLS
    /// connection's certificate proved, or that did not come over TLS.
    pub fn over_tls(mut self) -> Self {
        self.tls = true;
        self
    }

    fn verify(&self, request: &Request<()>) -> Result<u32, Refusal> {
        let token = request.metadata().get(TOKEN_HEADER).map(|v| v.as_bytes());
        let claimed = caller_node(request.metadata()).ok();
        let node = self.identity.verify(token, claimed)?;
        if self.tls {
            match request.extensions().get::<TlsPeer>() {
                Some(peer) if peer.node == node => {}
                Some(&TlsPeer { node: proven, .. }) => {
                    return Err(Refusal::NotTheTlsPeer {
                        claimed: node,
                        proven,
                    })
                }
                None => return Err(Refusal::NotOverTls),
            }
        }
        Ok(node)
    }
}

/// Compares without an early exit, so timing does not reveal a prefix.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Interceptor for TokenCheck {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        match self.verify(&request) {
            Ok(node) => {
                if let Some(mine) = &self.identity.epoch {
                    if let Some(caller) = epoch::of_call(request.metadata())? {
                        epoch::check(mine.get(), caller)?;
                    }
                }
                request.extensions_mut().insert(VerifiedPeer(node));
                Ok(request)
            }
            Err(refusal) => {
                // A member that joined through the membership calls before
                // this node's view (and so its record) caught up: told to
                // ask again, as any caller on a newer view is.
                if let (Refusal::NotAMember(_), Some(mine)) = (&refusal, &self.identity.epoch) {
                    if let Some(caller) = epoch::of_call(request.metadata())? {
                        if caller > mine.get() {
                            epoch::check(mine.get(), caller)?;
                        }
                    }
                }
                if matches!(
                    refusal,
                    Refusal::MissingToken
                        | Refusal::WrongToken
                        | Refusal::NotTheTlsPeer { .. }
                        | Refusal::NotOverTls
                ) {
                    let from = request
                        .remote_addr()
                        .or_else(|| request.extensions().get::<TlsPeer>()?.remote)
                        .map_or_else(|| "?".to_owned(), |a| a.to_string());
                    tracing::warn!(%from, "peer call refused: {refusal}");
                }
                Err(refusal.into())
            }
        }
    }
}

/// The node a checked call comes from (set by [`TokenCheck`]).
pub fn verified_peer<T>(request: &Request<T>) -> Result<u32, Status> {
    request
        .extensions()
        .get::<VerifiedPeer>()
        .map(|p| p.0)
        .ok_or_else(|| Status::unauthenticated("call not checked"))
}

/// The node id a caller claims in its metadata (unchecked).
pub fn caller_node(metadata: &MetadataMap) -> Result<u32, Status> {
    metadata
        .get(NODE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Status::invalid_argument(format!("missing or bad {NODE_HEADER}")))
}

/// Client side: adds the token and our node id to every outgoing call.
#[derive(Clone)]
pub struct Credentials {
    token: AsciiMetadataValue,
    node: AsciiMetadataValue,
    epoch: Option<Epoch>,
}

impl Credentials {
    /// Shared-token credentials claiming node `node` (per-node identities:
    /// [`PeerIdentity::credentials`]).
    pub fn new(token: &str, node: u32) -> Result<Self> {
        Ok(Self {
            token: ascii(token)?,
            node: AsciiMetadataValue::from(node),
            epoch: None,
        })
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let metadata = request.metadata_mut();
        metadata.insert(TOKEN_HEADER, self.token.clone());
        metadata.insert(NODE_HEADER, self.node.clone());
        let Some(epoch) = &self.epoch else {
            return Ok(request);
        };
        let method = request
            .extensions()
            .get::<tonic::GrpcMethod>()
            .map_or("", |m| m.method());
        if epoch::carries_epoch(method) {
            // Only where the view gives the call its meaning (`epoch`).
            request
                .metadata_mut()
                .insert(EPOCH_HEADER, AsciiMetadataValue::from(epoch.get()));
        } else if method == "Heartbeat" {
            let link = if epoch.in_touch() { "up" } else { "down" };
            request
                .metadata_mut()
                .insert(LINK_HEADER, AsciiMetadataValue::from_static(link));
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(check: &mut TokenCheck, token: Option<&str>, node: Option<&str>) -> Result<(), Status> {
        let mut request = Request::new(());
        if let Some(t) = token {
            request
                .metadata_mut()
                .insert(TOKEN_HEADER, t.parse().unwrap());
        }
        if let Some(n) = node {
            request
                .metadata_mut()
                .insert(NODE_HEADER, n.parse().unwrap());
        }
        check.call(request).map(|r| {
            assert!(r.extensions().get::<VerifiedPeer>().is_some());
        })
    }

    #[test]
    fn only_the_right_token_from_a_member_passes() {
        let mut check = TokenCheck::new(PeerIdentity::shared("secret", 3, 0).unwrap());
        assert!(call(&mut check, Some("secret"), Some("2")).is_ok());
        let code = |r: Result<(), Status>| r.unwrap_err().code();
        assert_eq!(
            code(call(&mut check, Some("secreT"), Some("0"))),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            code(call(&mut check, Some("secret!"), Some("0"))),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            code(call(&mut check, None, Some("0"))),
            tonic::Code::Unauthenticated
        );
        assert_eq!(
            code(call(&mut check, Some("secret"), Some("3"))),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            code(call(&mut check, Some("secret"), None)),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn credentials_round_trip_through_the_check() {
        let mut creds = Credentials::new("tok", 1).unwrap();
        let request = creds.call(Request::new(())).unwrap();
        assert_eq!(caller_node(request.metadata()).unwrap(), 1);
        assert!(TokenCheck::new(PeerIdentity::shared("tok", 2, 0).unwrap())
            .call(request)
            .is_ok());
        assert!(Credentials::new("bad\ntoken", 0).is_err());
    }

    /// A three-node cluster file with per-node identities, its keys in `dir`.
    fn cluster_with_keys(dir: &std::path::Path) -> (Topology, Vec<NodeKey>) {
        use std::fmt::Write;
        let keys: Vec<NodeKey> = (0..3).map(|_| NodeKey::generate().unwrap()).collect();
        let mut text = String::from("[cluster]\nname = \"k\"\ntoken = \"tok\"\n");
        for (i, key) in keys.iter().enumerate() {
            let path = dir.join(format!("n{i}.key"));
            key.save(&path).unwrap();
            let _ = write!(
                text,
                "\n[[node]]\nid = {i}\nrpc = \"127.0.0.1:{}\"\nsocket = \"/tmp/k{i}.sock\"\n\
                 region = \"/dev/shm/k{i}\"\nregion_size = 1024\npublic_key = \"{}\"\n\
                 key_file = \"n{i}.key\"\n",
                7000 + 2 * i,
                crate::node_keys::to_hex(&key.public())
            );
        }
        (Topology::parse(&text, Some(dir)).unwrap().sorted(), keys)
    }

    #[test]
    fn with_node_keys_a_member_cannot_speak_as_another() {
        let dir = tempfile::tempdir().unwrap();
        let (topology, keys) = cluster_with_keys(dir.path());
        let nodes: Vec<PeerIdentity> = (0..3)
            .map(|i| PeerIdentity::for_node(&topology, i).unwrap())
            .collect();
        assert!(nodes.iter().all(PeerIdentity::per_node));
        let zero = &nodes[0];
        // Node 1 to node 0, as itself: accepted as node 1.
        assert_eq!(
            zero.verify(Some(&nodes[1].token_for(0).unwrap()), Some(1)),
            Ok(1)
        );
        // Node 2's own credential to node 0, claiming to be node 1.
        assert_eq!(
            zero.verify(Some(&nodes[2].token_for(0).unwrap()), Some(1)),
            Err(Refusal::WrongToken)
        );
        // Node 1's credential to node 2, replayed by node 2 to node 0.
        assert_eq!(
            zero.verify(Some(&nodes[1].token_for(2).unwrap()), Some(1)),
            Err(Refusal::WrongToken)
        );
        // The cluster token alone no longer admits anyone.
        assert_eq!(zero.verify(Some(b"tok"), Some(1)), Err(Refusal::WrongToken));
        // Through the gRPC interceptors too.
        let mut check = TokenCheck::new(zero.clone());
        let request = nodes[2]
            .credentials(0)
            .unwrap()
            .call(Request::new(()))
            .unwrap();
        assert_eq!(caller_node(request.metadata()).unwrap(), 2);
        assert!(check.call(request).is_ok());
        let mut forged = nodes[2]
            .credentials(0)
            .unwrap()
            .call(Request::new(()))
            .unwrap();
        forged
            .metadata_mut()
            .insert(NODE_HEADER, "1".parse().unwrap());
        assert_eq!(
            check.call(forged).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        // A node's key must be the one the cluster file names for it.
        let err = PeerIdentity::with_key(&topology, 0, keys.into_iter().nth(1).unwrap())
            .err()
            .unwrap();
        assert_eq!(err.kind(), shoal_core::error::ErrorKind::PermissionDenied);
        // The command line speaks as the first node whose key it can read.
        assert_eq!(PeerIdentity::for_command_line(&topology).unwrap().me(), 0);
        std::fs::remove_file(dir.path().join("n0.key")).unwrap();
        assert_eq!(PeerIdentity::for_command_line(&topology).unwrap().me(), 1);
    }

    #[test]
    fn a_node_learned_from_the_membership_is_admitted_by_every_clone() {
        let dir = tempfile::tempdir().unwrap();
        let (mut topology, _keys) = cluster_with_keys(dir.path());
        topology.membership = Some(crate::MembershipConfig::new(
            "etcd://127.0.0.1:2379/k".parse().unwrap(),
        ));
        // Node 0's file does not list node 2: it joins later.
        let two = topology.node(2).unwrap().clone();
        let mut alone = topology.clone();
        alone.nodes.retain(|n| n.id != 2);
        let zero = PeerIdentity::for_node(&alone, 0).unwrap();
        let check = TokenCheck::new(zero.clone());
        let from_two = PeerIdentity::for_node(&topology, 2).unwrap();
        let token = from_two.token_for(0).unwrap();
        assert_eq!(
            check.identity.verify(Some(&token), Some(2)),
            Err(Refusal::NotAMember(2))
        );
        assert!(zero.credentials(2).is_err());
        zero.learn(&two).unwrap();
        assert_eq!(check.identity.verify(Some(&token), Some(2)), Ok(2));
        assert_eq!(
            from_two.verify(Some(&zero.token_for(2).unwrap()), Some(0)),
            Ok(0)
        );
        // Past the slots, or without a key where the cluster has them: refused.
        let mut far = two.clone();
        far.id = 64;
        assert!(zero.learn(&far).is_err());
        let mut keyless = two;
        keyless.identity = None;
        assert!(zero.learn(&keyless).is_err());
    }

    #[test]
    fn with_the_shared_token_any_member_may_claim_any_id() {
        // The documented weakness of older cluster files.
        let zero = PeerIdentity::shared("tok", 3, 0).unwrap();
        assert!(!zero.per_node());
        let two = PeerIdentity::shared("tok", 3, 2).unwrap();
        assert_eq!(
            zero.verify(Some(&two.token_for(0).unwrap()), Some(1)),
            Ok(1)
        );
    }
}
