//! Membership in a real etcd with a node that dies: `shoal serve` killed
//! with SIGKILL loses its etcd lease, the others remove it after its TTL and
//! move its homes back, and no node answers with bytes other than an id's
//! current object (its own objects, which lived in its memory, are gone,
//! not replaced).

use std::time::{Duration, Instant};

use shoal_cluster::MembershipConfig;
use shoal_core::ObjectId;
use shoal_testing::{
    loopback_topology, pattern, put_patterns, read_object, ClusterNode, EtcdCluster, ServeProcess,
};

use crate::support::shoal;

const TTL: Duration = Duration::from_secs(1);

#[test]
fn a_killed_member_is_removed_after_its_ttl_and_its_homes_move_back() {
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let mut topology = loopback_topology("killed", 3, 16 << 20, Duration::ZERO, dir.path());
    topology.membership = Some(MembershipConfig {
        url: etcd.url("shoal/killed").parse().unwrap(),
        ttl: TTL,
        grace: Duration::ZERO,
    });
    let file = dir.path().join("cluster.toml");
    std::fs::write(&file, topology.to_toml()).unwrap();
    let view = || etcd.get("/shoal/killed/view").unwrap_or_default();

    let n0 = ClusterNode::start(&topology, 0);
    let n1 = ClusterNode::start(&topology, 1);
    let mut serve = shoal();
    serve
        .args(["serve", "--no-prefault", "--node", "2", "--cluster"])
        .arg(&file);
    let n2 = ServeProcess::spawn(serve, &topology.nodes[2].socket);
    assert_eq!(view(), "epoch=3 members=0,1,2");

    let (mut c0, mut c1, mut c2) = (n0.client(), n1.client(), n2.client());
    let kept = put_patterns(&mut c0, &mut c1, 0..90);
    let mut lost = Vec::new();
    for seed in 100..130u32 {
        let id = ObjectId::random();
        c2.put(id, &pattern(seed), b"").unwrap();
        assert_eq!(read_object(&mut c0, id), Some(pattern(seed)));
        lost.push(id);
    }
    drop(c2);

    let killed = Instant::now();
    let _ = n2.kill();
    while view() != "epoch=4 members=0,1" {
        assert!(
            killed.elapsed() < TTL * 5,
            "node 2 still in the view {:?} after {:?}",
            view(),
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "killed member removed from the view after {:?} (TTL {TTL:?})",
        killed.elapsed()
    );

    // `shoal cluster status` shows the view and who is in it.
    let status = |json: bool| {
        let mut command = shoal();
        command.args(["cluster", "status", "--file"]).arg(&file);
        if json {
            command.arg("--json");
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let text = status(false);
    assert!(
        text.contains("membership etcd://") && text.contains("view 4, members 0,1"),
        "{text}"
    );
    // The survivors gained node 2's homes: `rebuilding` until the owners
    // restored them there (within a lease), then `up`.
    let started = Instant::now();
    let json = loop {
        let json = status(true);
        if json
            .lines()
            .take(2)
            .all(|row| row.contains("\"state\":\"up\""))
        {
            break json;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{json}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let rows: Vec<&str> = json.lines().collect();
    assert_eq!(rows.len(), 3, "{json}");
    for row in &rows[..2] {
        assert!(row.contains("\"view_epoch\":4"), "{row}");
        assert!(row.contains("\"view_members\":[0,1]"), "{row}");
    }
    assert!(rows[2].contains("\"state\":\"down\""), "{}", rows[2]);

    // Every object of the survivors reads back whole from both; node 2's
    // are gone (not found), never another object's bytes.
    for &(id, seed) in &kept {
        assert_eq!(read_object(&mut c1, id), Some(pattern(seed)), "{id}");
        assert_eq!(read_object(&mut c0, id), Some(pattern(seed)), "{id}");
    }
    for &id in &lost {
        assert_eq!(
            read_object(&mut c1, id),
            None,
            "{id} lived on the killed node"
        );
    }
    // Creates work at the homes that took node 2's share; ids stay unique.
    for seed in 200..230u32 {
        let id = ObjectId::random();
        c1.put(id, &pattern(seed), b"").unwrap();
        assert_eq!(read_object(&mut c0, id), Some(pattern(seed)));
    }
    let (id, _) = kept[3];
    assert!(c0.put(id, b"again", b"").is_err(), "{id} exists");
}
