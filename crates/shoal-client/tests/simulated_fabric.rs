//! The coherency protocol on a simulated non-coherent fabric: two real
//! daemons (cluster nodes) in this process, clients whose view of other
//! nodes' memory is a private "cache" copy synchronised only by flush (the
//! writer, before seal) and invalidate (the reader, before its first read).
//!
//! Built normally, readers see exactly the sealed bytes. Built with the
//! `broken-skip-flush` feature (a client that seals without flushing), the
//! same reads see memory that never received the bytes: the simulation
//! catches the missing step. CI runs both builds.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shoal_client::{Client, Located};
use shoal_cluster::{Access, Node, Topology};
use shoal_core::coherence::CoherenceMode;
use shoal_core::error::Result;
use shoal_core::protocol::CreateSpec;
use shoal_core::ObjectId;
use shoal_daemon::{ClusterConfig, DaemonConfig, Shutdown};

struct TestCluster {
    sockets: Vec<PathBuf>,
    shutdown: Shutdown,
    threads: Vec<JoinHandle<Result<()>>>,
    _dir: tempfile::TempDir,
}

impl TestCluster {
    fn start(nodes: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = {
            let held: Vec<_> = (0..2 * nodes)
                .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
                .collect();
            held.iter()
                .map(|l| l.local_addr().unwrap().port())
                .collect()
        };
        // Unique per cluster: tests run in parallel threads of one process.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("{}-{serial}", std::process::id());
        let topology = Topology {
            name: "simulated".into(),
            token: "test-token".into(),
            coherence: CoherenceMode::Noncoherent,
            simulate_caches: true,
            heartbeat: Duration::from_millis(100),
            lease: Duration::from_millis(1000),
            linger: Duration::from_millis(1000),
            nodes: (0..nodes)
                .map(|i| Node {
                    id: i,
                    rpc: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[2 * i as usize])),
                    data: SocketAddr::from((Ipv4Addr::LOCALHOST, ports[2 * i as usize + 1])),
                    socket: dir.path().join(format!("n{i}.sock")),
                    region: PathBuf::from(format!("/dev/shm/shoal-test-{tag}-{i}")),
                    region_size: 8 << 20,
                    access: Access::Mapped,
                })
                .collect(),
        };
        let shutdown = Shutdown::new();
        let threads = (0..nodes)
            .map(|node| {
                let mut config = DaemonConfig::new(&topology.nodes[node as usize].socket, 8 << 20);
                config.prefault = false;
                config.line_size = 128;
                config.cluster = Some(ClusterConfig {
                    topology: topology.clone(),
                    node,
                });
                let shutdown = shutdown.clone();
                std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
            })
            .collect();
        let sockets: Vec<PathBuf> = topology.nodes.iter().map(|n| n.socket.clone()).collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        for socket in &sockets {
            while Client::connect(socket).is_err() {
                assert!(Instant::now() < deadline, "node did not start");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        Self {
            sockets,
            shutdown,
            threads,
            _dir: dir,
        }
    }

    fn client(&self, node: usize) -> Client {
        Client::connect(&self.sockets[node]).unwrap()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.shutdown.trigger();
        for thread in self.threads.drain(..) {
            thread.join().unwrap().unwrap();
        }
    }
}

fn read(client: &mut Client, id: ObjectId) -> Vec<u8> {
    let found = client.get(&[id], 5_000).unwrap()[0].expect("sealed object found");
    let ptr = client.located_ptr(found).unwrap();
    // SAFETY: the get holds a reference; the range was bounds-checked on receipt.
    let bytes =
        unsafe { std::slice::from_raw_parts(ptr, found.location.data_size as usize) }.to_vec();
    client.release(&[id]).unwrap();
    bytes
}

/// What a reader must see with the full protocol, and does not see when the
/// writer skips its flush.
fn check(seen: &[u8], written: &[u8], what: &str) {
    if cfg!(feature = "broken-skip-flush") {
        assert_ne!(seen, written, "{what}: a missing flush went unnoticed");
    } else {
        assert_eq!(seen, written, "{what}");
    }
}

#[test]
fn readers_on_other_nodes_see_exactly_the_sealed_bytes() {
    let cluster = TestCluster::start(2);
    let (mut writer, mut reader) = (cluster.client(0), cluster.client(1));
    assert!(writer.cluster().unwrap().simulated);

    // Written on node 0, read on node 1.
    let first = ObjectId([1; 20]);
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8 + 1).collect();
    writer.put(first, &data, b"").unwrap();
    check(&read(&mut reader, first), &data, "first object");

    // Same range reused by a new object: the reader's copy of the range holds
    // the old bytes until its invalidate.
    writer.delete(&[first]).unwrap();
    let second = ObjectId([2; 20]);
    let newer: Vec<u8> = data.iter().map(|b| b.wrapping_mul(3) | 1).collect();
    writer.put(second, &newer, b"").unwrap();
    check(
        &read(&mut reader, second),
        &newer,
        "object reusing a freed range",
    );
}

#[test]
fn remote_allocation_is_flushed_by_its_writer() {
    let cluster = TestCluster::start(2);
    let (mut writer, mut reader) = (cluster.client(0), cluster.client(1));
    let id = ObjectId([3; 20]);
    let spec = CreateSpec {
        id,
        data_size: 1000,
        meta_size: 0,
    };
    // Allocated in node 1's memory, written from node 0.
    let located: Located = writer.create_on(1, &[spec], 0).unwrap()[0];
    assert_eq!(located.node, 1);
    let ptr = writer.located_ptr_mut(located).unwrap();
    // SAFETY: our own unsealed object, bounds-checked at allocation.
    unsafe { std::ptr::write_bytes(ptr, 0xAB, 1000) };
    writer.seal(&[id], true).unwrap();
    // Node 1 reads its own memory: only the writer's flush put the bytes there.
    check(
        &read(&mut reader, id),
        &[0xAB; 1000],
        "remotely allocated object",
    );
}
