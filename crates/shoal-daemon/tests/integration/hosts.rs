//! One cluster file for every host, end to end on loopback: peers dial each
//! node by host name ("localhost:PORT", resolved at every connection) while
//! the node binds a `listen` / `data_listen` address of its own
//! (127.0.0.1:PORT), and the file declares a mixed deployment with
//! `access = "host"`: nodes 0 and 1 on host "alpha" map each other's memory,
//! node 2 on host "beta" pulls theirs over the data channel and they pull
//! its. The hosts are names in the file: every daemon runs here.

use std::time::Duration;

use shoal_client::Client;
use shoal_cluster::{Access, Address, Topology};
use shoal_core::ObjectId;
use shoal_testing::TestCluster;

const MIB: u64 = 1 << 20;
const REGION_SIZE: u64 = 32 * MIB;

/// The cluster of the module doc: what it runs is a file an operator
/// could write.
fn start() -> TestCluster {
    TestCluster::start_with(
        "hosts",
        3,
        REGION_SIZE,
        Duration::ZERO,
        |topology| {
            for node in &mut topology.nodes {
                let (rpc, data) = (node.rpc.port(), node.data.port());
                node.host = Some(if node.id < 2 { "alpha" } else { "beta" }.into());
                node.rpc = Address::parse(&format!("localhost:{rpc}")).unwrap();
                node.data = Address::parse(&format!("localhost:{data}")).unwrap();
                node.listen = Some(Address::parse(&format!("127.0.0.1:{rpc}")).unwrap());
                node.data_listen = Some(Address::parse(&format!("127.0.0.1:{data}")).unwrap());
                node.access = Access::Host;
            }
            let text = topology.to_toml();
            assert!(text.contains("rpc = \"localhost:") && text.contains("access = \"host\""));
            let checked = Topology::check(&text, None);
            assert!(checked.errors.is_empty(), "{:#?}", checked.errors);
            assert_eq!(checked.topology.as_ref(), Some(&*topology));
        },
        |_, _, _| {},
    )
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
    let hosts = start();
    let mut clients: Vec<Client> = (0..3).map(|n| hosts.client(n)).collect();
    // Heartbeats reach every node at its name: each sees the others alive.
    shoal_testing::eventually("every node sees every other", || {
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
