//! A real Prometheus (Debian's `prometheus`, installed by
//! scripts/setup-test-tools.sh) scrapes an emulated 3-node cluster while a
//! paced workload runs; the rates and latency quantiles it computes match
//! what the workload did.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::Cluster;
use serde_json::Value;
use shoal_client::Client;
use shoal_core::ObjectId;
use shoal_testing::{encode, http_get, installed};

/// Puts per second on node 0, and how long the workload runs.
const PUT_RATE: f64 = 100.0;
const WORKLOAD: Duration = Duration::from_secs(8);
const OBJECT: usize = 4096;
/// Node 2's gets of ids nobody has wait this long, then time out.
const WAIT_MS: i64 = 20;

struct Prometheus {
    child: Child,
    address: std::net::SocketAddr,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(dir: &std::path::Path, targets: &[String]) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: shoal\n    static_configs:\n      - targets: [{}]\n",
                targets
                    .iter()
                    .map(|t| format!("'{t}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Self {
            child,
            address: ([127, 0, 0, 1], port).into(),
        }
    }

    /// An instant query's vector: (labels, value) per series.
    fn query(&self, promql: &str, at: Option<f64>) -> Vec<(Value, f64)> {
        let mut path = format!("/api/v1/query?query={}", encode(promql));
        if let Some(at) = at {
            path.push_str(&format!("&time={at:.3}"));
        }
        let (status, body) = http_get(self.address, &path).expect("query prometheus");
        assert_eq!(status, 200, "{promql}: {body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        answer["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|series| {
                let value = series["value"][1].as_str().unwrap().parse().unwrap();
                (series["metric"].clone(), value)
            })
            .collect()
    }

    fn one(&self, promql: &str, at: Option<f64>) -> f64 {
        let result = self.query(promql, at);
        assert_eq!(result.len(), 1, "{promql}: {result:?}");
        result[0].1
    }
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn prometheus_scrapes_a_cluster_and_its_rates_match_the_workload() {
    if !installed("prometheus") {
        eprintln!(
            "SKIPPED prometheus_scrapes_a_cluster_and_its_rates_match_the_workload: \
             `prometheus` is not installed (scripts/setup-test-tools.sh installs Debian's)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::up(dir.path(), 3, &format!("prom{}", std::process::id()));
    for node in 0..3 {
        let printed = format!("metrics http://{}/metrics", cluster.metrics(node));
        assert!(
            cluster.up_output.contains(&printed),
            "{}",
            cluster.up_output
        );
    }
    let targets: Vec<String> = (0..3).map(|n| cluster.metrics(n).to_string()).collect();
    let prometheus = Prometheus::start(dir.path(), &targets);
    wait_until("every node scraped", Duration::from_secs(60), || {
        http_get(prometheus.address, "/-/ready").is_ok_and(|(s, _)| s == 200)
            && prometheus.query("up == 1", None).len() == 3
    });

    // The workload: node 0 puts PUT_RATE objects a second (paced on an
    // absolute schedule) and node 1 gets each once from node 0's memory;
    // meanwhile node 2 is asked for ids nobody has, each get waiting WAIT_MS.
    let mut writer = Client::connect(cluster.socket(0)).unwrap();
    // Through node 1's daemon, so its gets show in node 1's op histogram (a
    // fast-path client reads node 0's index: no request at node 1).
    let mut reader = Client::connect_socket_only(cluster.socket(1)).unwrap();
    let mut waiter = Client::connect(cluster.socket(2)).unwrap();
    let started = Instant::now();
    let began = now();
    let missing = std::thread::spawn(move || {
        let mut misses = 0u64;
        while started.elapsed() < WORKLOAD {
            assert!(waiter.get(&[ObjectId::random()], WAIT_MS).unwrap()[0].is_none());
            misses += 1;
        }
        misses
    });
    let data = vec![3u8; OBJECT];
    let mut puts = 0u64;
    while started.elapsed() < WORKLOAD {
        let due = started + Duration::from_secs_f64(puts as f64 / PUT_RATE);
        if let Some(early) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(early);
        }
        let id = ObjectId::random();
        writer.put(id, &data, b"").unwrap();
        assert!(reader.get(&[id], 1000).unwrap()[0].is_some());
        reader.release(&[id]).unwrap();
        puts += 1;
    }
    let misses = missing.join().unwrap();
    let ended = now();
    let middle = (began + ended) / 2.0;
    assert!(misses > 10, "node 2's gets: {misses}");

    // Totals, once every node's scrape after the workload is in.
    let node = |n: u32| format!("instance=\"{}\"", cluster.metrics(n));
    wait_until(
        "a scrape of every node after the workload",
        Duration::from_secs(10),
        || {
            prometheus
                .query(&format!("timestamp(up) > {:.3}", ended + 0.1), None)
                .len()
                == 3
        },
    );
    assert_eq!(
        prometheus.one("sum(shoal_op_duration_seconds_count{op=\"create\"})", None),
        puts as f64
    );
    assert_eq!(
        prometheus.one(
            &format!("shoal_op_duration_seconds_count{{op=\"get\",{}}}", node(1)),
            None
        ),
        puts as f64
    );
    assert_eq!(
        prometheus.one(
            &format!("shoal_op_duration_seconds_count{{op=\"get\",{}}}", node(2)),
            None
        ),
        misses as f64
    );
    // The rate in the middle of the workload is the paced rate.
    let rate = prometheus.one(
        &format!(
            "rate(shoal_op_duration_seconds_count{{op=\"create\",{}}}[4s])",
            node(0)
        ),
        Some(middle),
    );
    assert!(
        (rate - PUT_RATE).abs() < 0.3 * PUT_RATE,
        "create rate {rate}/s, paced at {PUT_RATE}/s"
    );
    let seal_rate = prometheus.one(
        &format!("rate(shoal_sealed_bytes_total{{{}}}[4s])", node(0)),
        Some(middle),
    );
    assert!(
        (seal_rate - PUT_RATE * OBJECT as f64).abs() < 0.3 * PUT_RATE * OBJECT as f64,
        "sealed {seal_rate} B/s"
    );
    // Latency quantiles: node 2's gets each waited WAIT_MS (the bucket
    // from 16.4 to 32.8 ms); node 1's found their object at once.
    let window = format!("[{:.0}s]", ended - began + 2.0);
    let waited = prometheus.one(
        &format!(
            "histogram_quantile(0.5, sum by (le) (increase(shoal_op_duration_seconds_bucket{{op=\"get\",{}}}{window})))",
            node(2)
        ),
        None,
    );
    assert!(
        (0.016384..=0.032768).contains(&waited),
        "median wait {waited} s for {WAIT_MS} ms timeouts"
    );
    let found = prometheus.one(
        &format!(
            "histogram_quantile(0.5, sum by (le) (increase(shoal_op_duration_seconds_bucket{{op=\"get\",{}}}{window})))",
            node(1)
        ),
        None,
    );
    assert!(found < 0.008, "median get of an object on a peer {found} s");
    // Every query of the Grafana dashboard in docs/ is valid PromQL that
    // finds the cluster's series.
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/grafana/shoal-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$job", "shoal")
                .replace("$__rate_interval", &window[1..window.len() - 1]);
            assert!(
                !prometheus.query(&expr, None).is_empty(),
                "dashboard panel {}: no series for {expr}",
                panel["title"]
            );
            queries += 1;
        }
    }
    assert!(queries >= 8);
    // The gauges: every node up, node 0 holding the objects.
    assert_eq!(prometheus.query("shoal_peer_up == 1", None).len(), 6);
    // Nobody fenced, no reference call left unanswered.
    assert_eq!(
        prometheus.query("shoal_peer_quarantined == 0", None).len(),
        6
    );
    assert_eq!(
        prometheus
            .query("shoal_peer_unsettled_calls == 0", None)
            .len(),
        6
    );
    // Heartbeats: every node times its calls to each peer, in well under
    // the lease.
    assert_eq!(
        prometheus
            .query(
                "shoal_peer_rpc_duration_seconds_count{method=\"heartbeat\"} > 0",
                None
            )
            .len(),
        6
    );
    // Every peer method is timed, not only heartbeats: node 1 acquired each
    // object it read from node 0 once, and none of those calls failed.
    assert_eq!(
        prometheus.one(
            &format!(
                "shoal_peer_rpc_duration_seconds_count{{method=\"acquire\",peer=\"0\",{}}}",
                node(1)
            ),
            None
        ),
        puts as f64
    );
    assert!(prometheus
        .query(
            &format!(
                "shoal_peer_rpc_errors_total{{method=\"acquire\",{}}} > 0",
                node(1)
            ),
            None
        )
        .is_empty());
    let heartbeat = prometheus.one(
        "histogram_quantile(0.5, sum by (le) (rate(shoal_peer_rpc_duration_seconds_bucket{method=\"heartbeat\"}[10s])))",
        None,
    );
    assert!(
        heartbeat > 0.0 && heartbeat < 1.0,
        "median heartbeat {heartbeat} s"
    );
    // (Gauges and event counts are published once a second: a scrape or two.)
    let objects = format!("shoal_objects{{{}}}", node(0));
    let sealed = format!("shoal_sealed_bytes_total{{{}}}", node(0));
    wait_until(
        "node 0's objects and seals",
        Duration::from_secs(10),
        || {
            prometheus.one(&objects, None) == puts as f64
                && prometheus.one(&sealed, None) == (puts * OBJECT as u64) as f64
        },
    );
    // Node 2 dies: its peers miss its heartbeats and say it is down.
    let pid: i32 = std::fs::read_to_string(dir.path().join("n2.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // SAFETY: a signal to the daemon this test's cluster started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    wait_until(
        "heartbeat misses of node 2",
        Duration::from_secs(20),
        || {
            prometheus
            .query(
                "increase(shoal_peer_rpc_errors_total{method=\"heartbeat\",peer=\"2\"}[5s]) > 0",
                None,
            )
            .len()
            == 2
            && prometheus.query("shoal_peer_up{peer=\"2\"} == 0", None).len() == 2
        },
    );
}
