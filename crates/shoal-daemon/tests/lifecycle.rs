//! A daemon leaves nothing behind when it stops: started and stopped many
//! times in one process (alone, and as the nodes of a cluster), the process
//! ends with the threads and file descriptors it began with.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_cluster::Topology;
use shoal_core::ObjectId;
use shoal_daemon::{ClusterConfig, DaemonConfig, Shutdown};

/// The process's threads and descriptors are counted: one test at a time.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

fn wait_for(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Threads and descriptors settle (the runtime's blocking pool and closed
/// sockets go a moment after `run` returns): the smallest count seen over a
/// short wait.
fn settled(what: &str) -> usize {
    let mut least = count(what);
    for _ in 0..50 {
        if least == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        least = least.min(count(what));
    }
    least
}

/// A daemon on its own thread, in a runtime that outlives `run`: after
/// `run` returns, the runtime keeps going until `release` is sent, so any
/// task the daemon left behind would still be running (and holding its
/// sockets) while the test looks.
struct Running {
    thread: std::thread::JoinHandle<()>,
    returned: std::sync::mpsc::Receiver<()>,
    release: tokio::sync::oneshot::Sender<()>,
}

fn start(config: DaemonConfig, shutdown: Shutdown) -> Running {
    let (returned_tx, returned) = std::sync::mpsc::channel();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        local.block_on(&runtime, async move {
            shoal_daemon::run(config, shutdown).await.unwrap();
            returned_tx.send(()).unwrap();
            let _ = released.await;
        });
    });
    Running {
        thread,
        returned,
        release,
    }
}

impl Running {
    /// Waits for `run` to return; the runtime stays up.
    fn wait_returned(&self) {
        self.returned
            .recv_timeout(Duration::from_secs(10))
            .expect("run returned after shutdown");
    }

    fn finish(self) {
        let _ = self.release.send(());
        self.thread.join().unwrap();
    }
}

/// One `/metrics` request, left open (keep-alive) while the daemon stops.
fn scrape(address: std::net::SocketAddr) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    stream
}

#[test]
fn starting_and_stopping_leaves_no_task_thread_or_descriptor() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("shoal.sock");
    // One round first, so lazily created process state (the allocator's,
    // tracing's) is there before counting.
    let round = |i: usize| {
        let mut config = DaemonConfig::new(&socket, 1 << 20);
        config.prefault = i.is_multiple_of(2); // the prefault thread too
                                               // The metrics endpoint's thread too, scraped once.
        let metrics = (i % 3 != 1)
            .then(|| std::net::SocketAddr::from(([127, 0, 0, 1], shoal_testing::free_ports(1)[0])));
        config.metrics = metrics;
        let shutdown = Shutdown::new();
        let daemon = start(config, shutdown.clone());
        wait_for(&socket);
        let mut client = Client::connect(&socket).unwrap();
        let id = ObjectId::random();
        client.put(id, b"bytes", b"").unwrap();
        assert!(client.get(&[id], 0).unwrap()[0].is_some());
        // A client still connected, and one waiting in a get, at shutdown.
        let mut waiting = Client::connect(&socket).unwrap();
        let waiter = std::thread::spawn(move || waiting.get(&[ObjectId::random()], -1));
        let _scraper = metrics.map(scrape);
        std::thread::sleep(Duration::from_millis(5));
        shutdown.trigger();
        daemon.wait_returned();
        // The daemon's runtime is still up: its connections must be gone.
        assert!(
            waiter.join().unwrap().is_err(),
            "the waiting get ends with the daemon"
        );
        assert!(
            client.contains(id).is_err(),
            "an idle connection ends with the daemon"
        );
        if let Some(address) = metrics {
            TcpListener::bind(address).expect("the metrics port is free");
        }
        daemon.finish();
    };
    round(0);
    let (threads, fds) = (settled("/proc/self/task"), settled("/proc/self/fd"));
    for i in 1..=30 {
        round(i);
    }
    assert_eq!(settled("/proc/self/task"), threads, "threads left behind");
    assert_eq!(settled("/proc/self/fd"), fds, "descriptors left behind");
}

#[test]
fn cluster_nodes_stop_their_heartbeats_data_channels_and_peer_service() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let round = |i: usize| {
        let text = format!(
            "[cluster]\nname = \"lifecycle\"\ntoken = \"t\"\nheartbeat_ms = 20\nlease_ms = 200\n{}",
            (0..2)
                .map(|n| (n, shoal_testing::free_ports(3)))
                .map(|(n, ports)| format!(
                    "[[node]]\nid = {n}\nrpc = \"127.0.0.1:{}\"\ndata = \"127.0.0.1:{}\"\nmetrics = \"127.0.0.1:{}\"\nsocket = \"{dir}/n{n}.sock\"\nregion = \"{dir}/r{i}-{n}\"\nregion_size = 1048576\n",
                    ports[0],
                    ports[1],
                    ports[2],
                    dir = dir.path().display()
                ))
                .collect::<String>()
        );
        let topology = Topology::parse(&text, None).unwrap();
        let nodes: Vec<_> = (0..2u32)
            .map(|node| {
                let socket = dir.path().join(format!("n{node}.sock"));
                let mut config = DaemonConfig::new(&socket, 1 << 20);
                config.prefault = false;
                // (`shoal serve --cluster` takes it from the file likewise.)
                config.metrics = topology.nodes[node as usize].metrics;
                config.cluster = Some(ClusterConfig {
                    topology: topology.clone(),
                    node,
                });
                let shutdown = Shutdown::new();
                let running = start(config, shutdown.clone());
                wait_for(&socket);
                (socket, shutdown, running)
            })
            .collect();
        // Something crosses: a put on node 0, read through node 1.
        let mut a = Client::connect(&nodes[0].0).unwrap();
        let mut b = Client::connect(&nodes[1].0).unwrap();
        let id = ObjectId::random();
        // A node refuses claims until its peers heard it started.
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(err) = a.put(id, b"across", b"") {
            assert!(Instant::now() < deadline, "no put: {err}");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(b.get(&[id], 5_000).unwrap()[0].is_some());
        let _scrapers: Vec<_> = topology
            .nodes
            .iter()
            .filter_map(|n| n.metrics)
            .map(scrape)
            .collect();
        drop((a, b));
        for (_, shutdown, _) in &nodes {
            shutdown.trigger();
        }
        for (_, _, running) in &nodes {
            running.wait_returned();
        }
        // Both runtimes are still up: no accept loop, gRPC server,
        // heartbeat or metrics endpoint of either node may hold its ports
        // any more.
        for node in &topology.nodes {
            TcpListener::bind(&node.rpc).expect("the peer RPC port is free");
            TcpListener::bind(&node.data).expect("the data channel port is free");
            TcpListener::bind(node.metrics.unwrap()).expect("the metrics port is free");
        }
        for (_, _, running) in nodes {
            running.finish();
        }
    };
    round(0);
    let (threads, fds) = (settled("/proc/self/task"), settled("/proc/self/fd"));
    for i in 1..=8 {
        round(i);
    }
    assert_eq!(settled("/proc/self/task"), threads, "threads left behind");
    assert_eq!(settled("/proc/self/fd"), fds, "descriptors left behind");
}
