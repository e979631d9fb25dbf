//! `--log-format json`: a daemon's log lines are JSON objects a log
//! shipper reads as they are, with the message and the event's fields.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::shoal;
use serde_json::Value;
use shoal_testing::http_get;

#[test]
fn a_daemon_logs_json_lines_with_their_fields() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("json.sock");
    let mut daemon = shoal()
        .args([
            "--log-format",
            "json",
            "serve",
            "--capacity",
            "16MiB",
            "--no-prefault",
        ])
        .args(["--metrics-addr", "127.0.0.1:0", "--socket"])
        .arg(&socket)
        .env(
            "SHOAL_LOG",
            "debug,h2=info,hyper=info,tonic=info,tower=info",
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(daemon.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let mut metrics = None;
    while metrics.is_none()
        || !seen
            .iter()
            .any(|l: &Value| l["fields"]["message"] == "shoal daemon serving")
    {
        assert!(Instant::now() < deadline, "no start lines: {seen:?}");
        let line = lines.next().expect("the daemon's log").unwrap();
        let parsed: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(parsed["level"].is_string(), "{line}");
        assert!(parsed["timestamp"].is_string(), "{line}");
        if let Some(address) = parsed["fields"]["address"].as_str() {
            metrics = Some(address.parse::<std::net::SocketAddr>().unwrap());
        }
        seen.push(parsed);
    }
    let serving = seen
        .iter()
        .find(|l| l["fields"]["message"] == "shoal daemon serving")
        .unwrap();
    assert_eq!(serving["fields"]["capacity"], 16 << 20);
    assert_eq!(serving["fields"]["socket"], socket.display().to_string());
    // A client's lines carry its span (and the request's, at debug level).
    let client = shoal_client::Client::connect(&socket).unwrap();
    let connected = loop {
        assert!(Instant::now() < deadline, "no client line");
        let line: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        if line["fields"]["message"] == "client connected" {
            break line;
        }
    };
    let spans = connected["spans"].as_array().expect("the span list");
    assert_eq!(spans[0]["name"], "client", "{connected}");
    assert!(spans[0]["client"].is_u64(), "{connected}");
    assert_eq!(spans[1]["name"], "request", "{connected}");
    drop(client);
    // The endpoint logged (port 0 got a real port) answers.
    let (status, _) = http_get(metrics.unwrap(), "/metrics").unwrap();
    assert_eq!(status, 200);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    assert!(daemon.wait().unwrap().success());
    let last: Value = serde_json::from_str(&lines.last().unwrap().unwrap()).unwrap();
    assert_eq!(last["fields"]["message"], "shoal daemon stopped");
}
