//! Reads another daemon's `/metrics` (the status page's cluster table,
//! `shoal top`).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::HOST;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::metrics::exposition::{self, Sample};

/// Largest `/metrics` read.
const BODY_LIMIT: usize = 4 << 20;

/// The samples `address` serves at `/metrics`, read within `timeout`;
/// `None` if it does not answer in time, or not with metrics.
pub async fn scrape(address: SocketAddr, timeout: Duration) -> Option<Vec<Sample>> {
    let fetch = async {
        let stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
                .await
                .ok()?;
        let request = Request::get("/metrics")
            .header(HOST, address.to_string())
            .body(Empty::new())
            .ok()?;
        let exchange = async {
            let response = sender.send_request(request).await.ok()?;
            if response.status() != StatusCode::OK {
                return None;
            }
            Limited::new(response.into_body(), BODY_LIMIT)
                .collect()
                .await
                .ok()
        };
        let body = tokio::select! {
            body = exchange => body?,
            _ = connection => return None,
        };
        let text = String::from_utf8(body.to_bytes().to_vec()).ok()?;
        Some(exposition::parse(&text))
    };
    tokio::time::timeout(timeout, fetch).await.ok().flatten()
}
