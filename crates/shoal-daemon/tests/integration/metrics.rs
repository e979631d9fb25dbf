//! The HTTP endpoint of a daemon: `/metrics` counts what its clients did,
//! the status page shows the store's numbers, and the endpoint answers
//! only well-formed GETs without ever affecting the store.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_core::ObjectId;
use shoal_daemon::metrics::exposition::{self, Sample};

use shoal_testing::TestDaemon;

/// A test daemon serving `/metrics` and the status page on a free port.
struct Daemon {
    daemon: TestDaemon,
    http: SocketAddr,
}

impl Daemon {
    fn start(capacity: u64) -> Self {
        let http = SocketAddr::from(([127, 0, 0, 1], shoal_testing::free_ports(1)[0]));
        let daemon =
            TestDaemon::start_configured(capacity, |config, _| config.metrics = Some(http));
        Self { daemon, http }
    }

    fn client(&self) -> Client {
        self.daemon.client()
    }

    /// Sends `request` as is; returns the status code and the body.
    fn raw(&self, request: &[u8]) -> (u16, String) {
        let mut stream = TcpStream::connect(self.http).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.write_all(request).unwrap();
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = answer
            .split_once("\r\n\r\n")
            .map_or(String::new(), |(_, b)| b.to_owned());
        (status, body)
    }

    fn get(&self, path: &str) -> (u16, String) {
        self.raw(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
    }

    fn samples(&self) -> Vec<Sample> {
        let (status, body) = self.get("/metrics");
        assert_eq!(status, 200);
        assert!(body.trim_end().ends_with("# EOF"), "a whole exposition");
        exposition::parse(&body)
    }
}

fn value(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> f64 {
    samples
        .iter()
        .find(|s| s.name == name && label.is_none_or(|(k, v)| s.label(k) == Some(v)))
        .unwrap_or_else(|| panic!("no sample {name} {label:?}"))
        .value
}

#[test]
fn metrics_count_what_clients_did() {
    let daemon = Daemon::start(1 << 20);
    // Through the socket: every get and release is a request, timed.
    let mut client = daemon.daemon.socket_client();
    let ids: Vec<ObjectId> = (0..5).map(|_| ObjectId::random()).collect();
    for id in &ids {
        client.put(*id, &[7u8; 1000], b"meta").unwrap();
    }
    for _ in 0..3 {
        assert!(client.get(&ids[..1], 0).unwrap()[0].is_some());
        client.release(&ids[..1]).unwrap();
    }
    // Through the fast path: counted apart (no request), and still counted
    // once the client has gone.
    {
        let mut fast = daemon.client();
        for _ in 0..2 {
            assert!(fast.get(&ids[1..2], 0).unwrap()[0].is_some());
            fast.release(&ids[1..2]).unwrap();
        }
    }
    assert!(client.delete(&ids[4..]).unwrap()[0].is_ok());
    let counted = daemon.samples();
    let op = |op| {
        value(
            &counted,
            "shoal_op_duration_seconds_count",
            Some(("op", op)),
        )
    };
    assert_eq!(op("create"), 5.0);
    assert_eq!(op("seal"), 5.0);
    assert_eq!(op("get"), 3.0);
    assert_eq!(op("release"), 3.0);
    assert_eq!(op("delete"), 1.0);
    assert_eq!(op("abort"), 0.0);
    // Every get took under a second: all three in the 1.048576 s bucket.
    let bucket = |le| {
        counted
            .iter()
            .find(|s| {
                s.name == "shoal_op_duration_seconds_bucket"
                    && s.label("op") == Some("get")
                    && s.label("le") == Some(le)
            })
            .unwrap()
            .value
    };
    assert_eq!(bucket("1.048576"), 3.0);
    assert_eq!(bucket("+Inf"), 3.0);
    assert!(
        value(
            &counted,
            "shoal_op_duration_seconds_sum",
            Some(("op", "get"))
        ) > 0.0
    );
    assert_eq!(value(&counted, "shoal_node", Some(("node", "0"))), 1.0);
    // The store's figures and the events counted arrive with the next
    // snapshot (once a second).
    let used = client.stats().unwrap().used;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let samples = daemon.samples();
        if value(&samples, "shoal_objects", None) == 4.0 {
            assert_eq!(value(&samples, "shoal_used_bytes", None), used as f64);
            assert_eq!(
                value(&samples, "shoal_capacity_bytes", None),
                (1 << 20) as f64
            );
            assert_eq!(value(&samples, "shoal_clients", None), 1.0);
            assert_eq!(value(&samples, "shoal_sealed_total", None), 5.0);
            assert_eq!(
                value(&samples, "shoal_sealed_bytes_total", None),
                5.0 * 1004.0
            );
            assert_eq!(value(&samples, "shoal_deleted_total", None), 1.0);
            assert_eq!(value(&samples, "shoal_fast_gets_total", None), 2.0);
            break;
        }
        assert!(Instant::now() < deadline, "no snapshot of the store");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The status page shows the same numbers.
    let (status, page) = daemon.get("/");
    assert_eq!(status, 200);
    assert!(page.contains("shoal node 0"), "{page}");
    assert!(page.contains("<td id=\"objects\">4</td>"), "{page}");
    assert!(page.contains("<td id=\"op-create\">5</td>"), "{page}");
    assert!(page.contains("<svg id=\"capacity-chart\""), "{page}");
    assert!(!page.contains("<script"), "the page runs no script");
    assert!(!page.contains("<form"), "the page offers no action");
}

#[test]
fn the_endpoint_answers_only_well_formed_gets_and_never_touches_the_store() {
    let daemon = Daemon::start(1 << 20);
    let mut client = daemon.client();
    let id = ObjectId::random();
    client.put(id, b"kept", b"").unwrap();
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let (status, _) = daemon.raw(
            format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}").as_bytes(),
        );
        assert_eq!(status, 405, "{method}");
    }
    assert_eq!(daemon.get("/objects").0, 404);
    assert_eq!(daemon.get("/metrics/../delete").0, 404);
    assert_eq!(daemon.raw(b"HELLO THERE\r\n\r\n").0, 400, "not HTTP");
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    let (status, _) = daemon.raw(huge.as_bytes());
    assert!(
        status == 431 || status == 400 || status == 0,
        "oversized head: {status}"
    );
    let (status, _) = daemon.raw(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(status, 200);
    // Many idle connections (a scraper that hangs) do not stop the store,
    // nor (once they go) the endpoint.
    let idle: Vec<_> = (0..64)
        .map(|_| TcpStream::connect(daemon.http).unwrap())
        .collect();
    assert!(client.contains(id).unwrap());
    let other = ObjectId::random();
    client.put(other, b"more", b"").unwrap();
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(5);
    // (Closed connections free their slots as the endpoint notices.)
    while !daemon.get("/metrics").1.contains("shoal_sealed_total 2\n") {
        assert!(Instant::now() < deadline, "the endpoint answers again");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        client.contains(id).unwrap(),
        "nothing removed by any request"
    );
}
