//! Every peer call carries the cluster token and the caller's node id as
//! gRPC metadata; the server refuses (and logs) calls with a wrong or missing
//! token before any handler runs.

use std::sync::Arc;

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::{Request, Status};

pub const TOKEN_HEADER: &str = "x-shoal-token";
pub const NODE_HEADER: &str = "x-shoal-node";

/// Who a calling peer is, checked the same way on the gRPC channel (the
/// token and node headers) and on the bulk data channel (its request
/// header): the one place where a peer's claim becomes a node id. Per-node
/// credentials replace the shared token here.
#[derive(Clone)]
pub struct PeerIdentity {
    token: Arc<[u8]>,
    nodes: u32,
}

/// Why a peer's claim was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    MissingToken,
    WrongToken,
    /// No node id, or not a number.
    NoNode,
    NotAMember(u32),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::MissingToken => write!(f, "missing cluster token"),
            Self::WrongToken => write!(f, "wrong cluster token"),
            Self::NoNode => write!(f, "missing or bad {NODE_HEADER}"),
            Self::NotAMember(node) => write!(f, "node {node} is not a member of this cluster"),
        }
    }
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Self {
        let message = refusal.to_string();
        match refusal {
            Refusal::MissingToken | Refusal::WrongToken => Status::unauthenticated(message),
            Refusal::NoNode => Status::invalid_argument(message),
            Refusal::NotAMember(_) => Status::permission_denied(message),
        }
    }
}

/// The node a call was verified to come from, put in the request's
/// extensions by the gRPC check for the handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedPeer(pub u32);

impl PeerIdentity {
    pub fn new(token: &str, nodes: u32) -> Self {
        Self {
            token: token.as_bytes().into(),
            nodes,
        }
    }

    /// A caller offering `token` and claiming to be node `claimed`.
    pub fn verify(&self, token: Option<&[u8]>, claimed: Option<u32>) -> Result<u32, Refusal> {
        match token {
            None => return Err(Refusal::MissingToken),
            Some(t) if !same(t, &self.token) => return Err(Refusal::WrongToken),
            Some(_) => {}
        }
        match claimed {
            None => Err(Refusal::NoNode),
            Some(node) if node >= self.nodes => Err(Refusal::NotAMember(node)),
            Some(node) => Ok(node),
        }
    }
}

/// Server side: checks every incoming call before any handler runs, and
/// hands the handlers the verified node ([`VerifiedPeer`]).
#[derive(Clone)]
pub struct TokenCheck {
    identity: PeerIdentity,
}

impl TokenCheck {
    pub fn new(identity: PeerIdentity) -> Self {
        Self { identity }
    }
}

/// Compares without an early exit, so timing does not reveal a prefix.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Interceptor for TokenCheck {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let token = request.metadata().get(TOKEN_HEADER).map(|v| v.as_bytes());
        let claimed = caller_node(request.metadata()).ok();
        match self.identity.verify(token, claimed) {
            Ok(node) => {
                request.extensions_mut().insert(VerifiedPeer(node));
                Ok(request)
            }
            Err(refusal) => {
                if matches!(refusal, Refusal::MissingToken | Refusal::WrongToken) {
                    let from = request
                        .remote_addr()
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
}

impl Credentials {
    pub fn new(token: &str, node: u32) -> Result<Self, shoal_core::ShoalError> {
        let token = AsciiMetadataValue::try_from(token).map_err(|_| {
            shoal_core::ShoalError::invalid("the cluster token must be printable ASCII")
        })?;
        Ok(Self {
            token,
            node: AsciiMetadataValue::from(node),
        })
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let metadata = request.metadata_mut();
        metadata.insert(TOKEN_HEADER, self.token.clone());
        metadata.insert(NODE_HEADER, self.node.clone());
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
        let mut check = TokenCheck::new(PeerIdentity::new("secret", 3));
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
        assert!(TokenCheck::new(PeerIdentity::new("tok", 2))
            .call(request)
            .is_ok());
        assert!(Credentials::new("bad\ntoken", 0).is_err());
    }
}
