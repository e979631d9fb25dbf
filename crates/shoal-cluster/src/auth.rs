//! Every peer call carries the cluster token and the caller's node id as
//! gRPC metadata; the server refuses (and logs) calls with a wrong or missing
//! token before any handler runs.

use std::sync::Arc;

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::service::Interceptor;
use tonic::{Request, Status};

pub const TOKEN_HEADER: &str = "x-shoal-token";
pub const NODE_HEADER: &str = "x-shoal-node";

/// Server side: checks the token of every incoming call.
#[derive(Clone)]
pub struct TokenCheck {
    token: Arc<[u8]>,
    nodes: u32,
}

impl TokenCheck {
    pub fn new(token: &str, nodes: u32) -> Self {
        Self {
            token: token.as_bytes().into(),
            nodes,
        }
    }
}

/// Compares without an early exit, so timing does not reveal a prefix.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Interceptor for TokenCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let offered = request.metadata().get(TOKEN_HEADER).map(|v| v.as_bytes());
        if !offered.is_some_and(|t| same(t, &self.token)) {
            let from = request
                .remote_addr()
                .map_or_else(|| "?".to_owned(), |a| a.to_string());
            let why = if offered.is_some() {
                "wrong"
            } else {
                "missing"
            };
            tracing::warn!(%from, "peer call refused: {why} cluster token");
            return Err(Status::unauthenticated(format!("{why} cluster token")));
        }
        match caller_node(request.metadata()) {
            Ok(node) if node < self.nodes => Ok(request),
            Ok(node) => Err(Status::permission_denied(format!(
                "node {node} is not a member of this cluster"
            ))),
            Err(status) => Err(status),
        }
    }
}

/// The calling node's id, from the metadata the client interceptor sets.
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
        check.call(request).map(|_| ())
    }

    #[test]
    fn only_the_right_token_from_a_member_passes() {
        let mut check = TokenCheck::new("secret", 3);
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
        assert!(TokenCheck::new("tok", 2).call(request).is_ok());
        assert!(Credentials::new("bad\ntoken", 0).is_err());
    }
}
