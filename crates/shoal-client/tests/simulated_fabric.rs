//! The coherency protocol on a simulated non-coherent fabric: two real
//! daemons (cluster nodes) in this process, clients whose view of other
//! nodes' memory is a private "cache" copy synchronised only by flush (the
//! writer, before seal) and invalidate (the reader, before its first read).
//!
//! Built normally, readers see exactly the sealed bytes. Built with the
//! `broken-skip-flush` feature (a client that seals without flushing), the
//! same reads see memory that never received the bytes; built with
//! `broken-skip-owner-invalidate` (a client that reads objects a peer wrote
//! into its own node's memory without invalidating them), the owner node's
//! readers see what its caches held of the range before: the simulation
//! catches each missing step. Every check names the faults its read depends
//! on, and each fault has checks that depend on it alone, so CI runs the
//! normal build and one build with both faults.

use std::time::Duration;

use shoal_client::{Client, Located};
use shoal_core::coherence::CoherenceMode;
use shoal_core::protocol::CreateSpec;
use shoal_core::region::Mapping;
use shoal_core::ObjectId;
use shoal_testing::TestCluster;

const REGION_SIZE: u64 = 8 << 20;

/// `nodes` nodes on a simulated non-coherent fabric (every process's
/// caches simulated, 128-byte lines), each node's memory readable beside
/// them.
struct Simulated(TestCluster);

impl Simulated {
    fn start(nodes: u32) -> Self {
        let cluster = TestCluster::start_with(
            "simulated",
            nodes,
            REGION_SIZE,
            Duration::from_millis(1000),
            |topology| {
                topology.coherence = CoherenceMode::Noncoherent;
                topology.simulate_caches = true;
                topology.lease = Duration::from_millis(1000);
            },
            |_, config, _| config.line_size = 128,
        );
        Self(cluster.checked())
    }

    fn client(&self, node: usize) -> Client {
        self.0.client(node)
    }

    /// What node `node`'s memory itself holds of an object's range: no
    /// process's simulated cache in between.
    fn memory(&self, node: usize, located: Located) -> Vec<u8> {
        let region = &self.0.topology.nodes[node].region;
        let memory = Mapping::map_path_readonly(region, REGION_SIZE).unwrap();
        let l = located.location;
        assert!(memory.holds(&l));
        // SAFETY: inside the mapping (checked just above).
        unsafe {
            std::slice::from_raw_parts(memory.base().add(l.offset as usize), l.size() as usize)
        }
        .to_vec()
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

/// The broken builds: writers that skip their flush, readers that skip the
/// invalidate of objects a peer wrote into their own node's memory.
const SKIPS_FLUSH: bool = cfg!(feature = "broken-skip-flush");
const SKIPS_OWNER_INVALIDATE: bool = cfg!(feature = "broken-skip-owner-invalidate");

/// What a reader must see with the full protocol, and does not see when
/// (`broken`) the build skips a step this read depends on.
fn check(seen: &[u8], written: &[u8], what: &str, broken: bool) {
    let head = |bytes: &[u8]| format!("{:?}…", &bytes[..bytes.len().min(8)]);
    if broken {
        assert!(seen != written, "{what}: a missing step went unnoticed");
    } else {
        assert!(
            seen == written,
            "{what}: read {} where {} was sealed",
            head(seen),
            head(written)
        );
    }
}

#[test]
fn readers_on_other_nodes_see_exactly_the_sealed_bytes() {
    let cluster = Simulated::start(2);
    let (mut writer, mut reader) = (cluster.client(0), cluster.client(1));
    assert!(writer.cluster().unwrap().simulated);

    // Written on node 0, read on node 1.
    let first = ObjectId([1; 20]);
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8 + 1).collect();
    writer.put(first, &data, b"").unwrap();
    check(
        &read(&mut reader, first),
        &data,
        "first object",
        SKIPS_FLUSH,
    );

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
        SKIPS_FLUSH,
    );
}

#[test]
fn remote_allocation_is_flushed_by_its_writer() {
    let cluster = Simulated::start(2);
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
    // Node 1 reads its own memory: only the writer's flush put the bytes
    // there, and only the reader's invalidate makes it look.
    check(
        &read(&mut reader, id),
        &[0xAB; 1000],
        "remotely allocated object",
        SKIPS_FLUSH || SKIPS_OWNER_INVALIDATE,
    );
}

/// Writes `fill` into a new object of `size` bytes allocated in node
/// `node`'s memory by `writer`, seals it; returns where it lies.
fn put_on(writer: &mut Client, node: u32, id: ObjectId, size: u64, fill: u8) -> Located {
    let spec = CreateSpec {
        id,
        data_size: size,
        meta_size: 0,
    };
    let located = writer.create_on(node, &[spec], 0).unwrap()[0];
    let ptr = writer.located_ptr_mut(located).unwrap();
    // SAFETY: our own unsealed object, bounds-checked at allocation.
    unsafe { std::ptr::write_bytes(ptr, fill, size as usize) };
    writer.seal(&[id], true).unwrap();
    located
}

#[test]
fn the_owner_node_invalidates_what_a_peer_wrote_into_its_memory() {
    let cluster = Simulated::start(2);
    let (mut owner, mut peer) = (cluster.client(0), cluster.client(1));
    const SIZE: usize = 4096;

    // A node-0 client writes and reads an object: node 0's caches now hold
    // its bytes (a flush keeps the written lines).
    let local = ObjectId([4; 20]);
    owner.put(local, &[0x11; SIZE], b"").unwrap();
    let range = owner.get(&[local], 0).unwrap()[0].unwrap();
    assert!(
        !range.invalidate,
        "an object written on its node needs no invalidate"
    );
    owner.release(&[local]).unwrap();
    check(
        &read(&mut owner, local),
        &[0x11; SIZE],
        "local object",
        SKIPS_FLUSH,
    );
    owner.delete(&[local]).unwrap();

    // A node-1 client writes new objects into that range of node 0's
    // memory, twice: over bytes node 0 wrote, then over bytes it read as
    // another peer-written object. Each check depends on one step only (the
    // writer's flush puts the bytes in memory, the owner's invalidate makes
    // its readers see memory), so a build that skips both catches each.
    for (n, fill) in [(5, 0x22), (6, 0x33)] {
        let id = ObjectId([n; 20]);
        let placed = put_on(&mut peer, 0, id, SIZE as u64, fill);
        assert_eq!(
            placed.location.offset, range.location.offset,
            "range reused"
        );
        let memory = cluster.memory(0, placed);
        check(
            &memory,
            &[fill; SIZE],
            "node 0's memory after the seal",
            SKIPS_FLUSH,
        );
        let got = owner.get(&[id], 0).unwrap()[0].unwrap();
        assert!(got.invalidate, "the owner's daemon flags what a peer wrote");
        owner.release(&[id]).unwrap();
        let what = format!("node 0 reading object {n}");
        check(
            &read(&mut owner, id),
            &memory,
            &what,
            SKIPS_OWNER_INVALIDATE,
        );
        // The writer's node reads it as any other node's object.
        check(
            &read(&mut peer, id),
            &[fill; SIZE],
            "node 1 reading it",
            SKIPS_FLUSH,
        );
        owner.delete(&[id]).unwrap();
    }
}
