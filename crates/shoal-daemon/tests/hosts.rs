//! One cluster file for every host, end to end on loopback: peers dial each
//! node by host name ("localhost:PORT", resolved at every connection) while
//! the node binds a `listen` / `data_listen` address of its own
//! (127.0.0.1:PORT), and the file declares a mixed deployment with
//! `access = "host"`: nodes 0 and 1 on host "alpha" map each other's memory,
//! node 2 on host "beta" pulls theirs over the data channel and they pull
//! its. The hosts are names in the file: every daemon runs here.

mod support;

use std::time::{Duration, Instant};

use shoal_client::Client;
use shoal_cluster::{Access, Address, Topology};
use shoal_core::ObjectId;
use shoal_daemon::{ClusterConfig, DaemonConfig, Shutdown};

const MIB: u64 = 1 << 20;
const REGION_SIZE: u64 = 32 * MIB;

struct Hosts {
    topology: Topology,
    shutdown: Shutdown,
    threads: Vec<std::thread::JoinHandle<shoal_core::error::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Hosts {
    fn start() -> Self {
        support::init_logs();
        let dir = tempfile::tempdir().unwrap();
        let mut topology =
            support::loopback_topology("hosts", 3, REGION_SIZE, Duration::ZERO, dir.path());
        for node in &mut topology.nodes {
            let (rpc, data) = (node.rpc.port(), node.data.port());
            node.host = Some(if node.id < 2 { "alpha" } else { "beta" }.into());
            node.rpc = Address::parse(&format!("localhost:{rpc}")).unwrap();
            node.data = Address::parse(&format!("localhost:{data}")).unwrap();
            node.listen = Some(Address::parse(&format!("127.0.0.1:{rpc}")).unwrap());
            node.data_listen = Some(Address::parse(&format!("127.0.0.1:{data}")).unwrap());
            node.access = Access::Host;
        }
        // What the daemons run is a file an operator could write.
        let text = topology.to_toml();
        assert!(text.contains("rpc = \"localhost:") && text.contains("access = \"host\""));
        let checked = Topology::check(&text, None);
        assert!(checked.errors.is_empty(), "{:#?}", checked.errors);
        assert_eq!(checked.topology.as_ref(), Some(&topology));
        let shutdown = Shutdown::new();
        let mut threads = (0..3)
            .map(|node| {
                let mut config =
                    DaemonConfig::new(&topology.nodes[node as usize].socket, REGION_SIZE);
                config.prefault = false;
                config.cluster = Some(ClusterConfig {
                    topology: topology.clone(),
                    node,
                });
                let shutdown = shutdown.clone();
                std::thread::spawn(move || shoal_daemon::serve_blocking(config, shutdown))
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &topology.nodes {
            support::wait_started(&node.socket, &mut threads, deadline);
        }
        Self {
            topology,
            shutdown,
            threads,
            _dir: dir,
        }
    }

    fn client(&self, node: usize) -> Client {
        Client::connect(&self.topology.nodes[node].socket).unwrap()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.shutdown.trigger();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Puts `size` bytes of a pattern seeded by `seed` on `client`'s node.
fn put(client: &mut Client, size: usize, seed: u8) -> (ObjectId, Vec<u8>) {
    let id = ObjectId::random();
    let data: Vec<u8> = (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    client.put(id, &data, b"").unwrap();
    (id, data)
}

/// Gets `id` through `client`; returns the node whose memory holds what it
/// reads (the owner: mapped; the reader's own node: a pulled copy) after
/// checking the bytes.
fn read(client: &mut Client, id: ObjectId, expected: &[u8]) -> u32 {
    let located = client.get(&[id], 10_000).unwrap()[0].expect("found");
    let ptr = client.located_ptr(located).unwrap();
    assert_eq!(located.location.data_size, expected.len() as u64);
    // SAFETY: referenced by the get; bounds checked on receipt.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, expected.len()) };
    assert!(bytes == expected, "the owner's bytes");
    client.release(&[id]).unwrap();
    located.node
}

#[test]
fn peers_dialed_by_name_and_a_mixed_deployment_work_end_to_end() {
    let hosts = Hosts::start();
    let mut clients: Vec<Client> = (0..3).map(|n| hosts.client(n)).collect();
    // Heartbeats reach every node at its name: each sees the others alive.
    support::eventually("every node sees every other", || {
        clients
            .iter_mut()
            .all(|c| c.cluster_nodes().unwrap().iter().all(|n| n.alive))
    });
    // Each daemon tells its clients what they map: their host's regions.
    let mapped: Vec<Vec<bool>> = clients
        .iter_mut()
        .map(|c| {
            c.cluster_nodes()
                .unwrap()
                .iter()
                .map(|n| n.mapped)
                .collect()
        })
        .collect();
    assert_eq!(
        mapped,
        [
            vec![true, true, false],
            vec![true, true, false],
            vec![false, false, true]
        ]
    );
    // Node 0's object: read in place on alpha, pulled to beta over node 0's
    // data channel (dialed at localhost:PORT, bound at 127.0.0.1:PORT).
    let (id, data) = put(&mut clients[0], 3 * MIB as usize + 5, 1);
    assert_eq!(read(&mut clients[1], id, &data), 0, "mapped on its host");
    assert_eq!(read(&mut clients[2], id, &data), 2, "a copy on beta");
    // And back: node 2's object is pulled to alpha, never mapped there;
    // node 1 may then read node 0's copy in place (it is on its host).
    let (id, data) = put(&mut clients[2], 20 * 1024, 2);
    assert_eq!(read(&mut clients[0], id, &data), 0, "a copy on alpha");
    let on = read(&mut clients[1], id, &data);
    assert!(
        on == 0 || on == 1,
        "a copy on alpha, not node 2's memory: {on}"
    );
    // Node 1's small object, read from node 0 in place.
    let (id, data) = put(&mut clients[1], 100, 3);
    assert_eq!(read(&mut clients[0], id, &data), 1, "mapped on its host");
}
