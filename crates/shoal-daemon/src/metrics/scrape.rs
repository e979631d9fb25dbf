//! Reads another daemon's `/metrics` (the status page's cluster table,
//! `shoal top`) and `/top` (`shoal top`).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::HOST;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;

use crate::metrics::exposition::{self, Sample};

/// Largest body read.
const BODY_LIMIT: usize = 4 << 20;

/// The samples `address` serves at `/metrics`, read within `timeout`;
/// `None` if it does not answer in time, or not with metrics.
pub async fn scrape(address: SocketAddr, timeout: Duration) -> Option<Vec<Sample>> {
    let text = fetch(address, "/metrics", timeout).await?;
    Some(exposition::parse(&text))
}

/// The body `address` serves at `path` (GET), read within `timeout`;
/// `None` if it does not answer in time, or not with 200 and UTF-8.
pub async fn fetch(address: SocketAddr, path: &str, timeout: Duration) -> Option<String> {
    let fetch = async {
        let stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
                .await
                .ok()?;
        let request = Request::get(path)
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
        String::from_utf8(body.to_bytes().to_vec()).ok()
    };
    tokio::time::timeout(timeout, fetch).await.ok().flatten()
}
