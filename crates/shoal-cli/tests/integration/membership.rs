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

/// A membership in `etcd` under `shoal/<name>`, with this file's TTL.
fn membership(etcd: &EtcdCluster, name: &str) -> MembershipConfig {
    MembershipConfig {
        ttl: TTL,
        ..MembershipConfig::new(etcd.url(&format!("shoal/{name}")).parse().unwrap())
    }
}

/// What `shoal cluster status` prints for the cluster of `file` (`--json`
/// with `json`).
fn cluster_status(file: &std::path::Path, json: bool) -> String {
    let mut command = shoal();
    command.args(["cluster", "status", "--file"]).arg(file);
    if json {
        command.arg("--json");
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `shoal serve` on a host whose file lists only its own node (id 5, with
/// its own key; the etcd URL given as `--membership`, not in the file): it
/// joins the members through its etcd record, and
/// `shoal cluster status` run with the members' file (which lacks it)
/// reaches it through what they learned.
#[test]
fn a_node_absent_from_the_file_joins_and_cluster_status_lists_it() {
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let mut all = loopback_topology("absent", 3, 16 << 20, Duration::ZERO, dir.path());
    all.membership = Some(MembershipConfig {
        max_nodes: 8,
        ..membership(&etcd, "absent")
    });
    shoal_testing::with_node_keys(&mut all, dir.path());
    all.nodes[2].id = 5;
    let only = |ids: &[u32], name: &str| {
        let mut file = all.clone();
        file.nodes.retain(|n| ids.contains(&n.id));
        let path = dir.path().join(name);
        std::fs::write(&path, file.to_toml()).unwrap();
        (file, path)
    };
    let (members, members_file) = only(&[0, 1], "members.toml");
    let (newcomer, newcomer_file) = only(&[5], "newcomer.toml");
    let check = shoal()
        .args(["cluster", "check"])
        .arg(&newcomer_file)
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    // The same file without its `membership` line: valid only with the URL
    // given on the command line.
    let url = newcomer.membership.as_ref().unwrap().url.to_string();
    let text = newcomer.to_toml();
    let bare = text.replace(&format!("membership = \"{url}\"\n"), "");
    assert_ne!(bare, text);
    std::fs::write(&newcomer_file, bare).unwrap();

    let n0 = ClusterNode::start(&members, 0);
    let n1 = ClusterNode::start(&members, 1);
    let mut serve = shoal();
    serve
        .args([
            "serve",
            "--no-prefault",
            "--node",
            "5",
            "--membership",
            &url,
            "--cluster",
        ])
        .arg(&newcomer_file);
    let n5 = ServeProcess::spawn_node(serve, all.node(5).unwrap());
    let view = || etcd.get("/shoal/absent/view").unwrap_or_default();
    assert_eq!(view(), "epoch=3 members=0,1,5");

    let (mut c0, mut c5) = (n0.client(), n5.client());
    for seed in 0..20u32 {
        let id = ObjectId::random();
        c5.put(id, &pattern(seed), b"").unwrap();
        assert_eq!(read_object(&mut c0, id), Some(pattern(seed)), "{id}");
    }
    let started = Instant::now();
    let json = loop {
        let json = cluster_status(&members_file, true);
        if json.lines().count() == 3 && json.lines().all(|r| r.contains("\"state\":\"up\"")) {
            break json;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{json}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let rows: Vec<&str> = json.lines().collect();
    assert!(rows[2].starts_with("{\"node\":5,"), "{json}");
    assert!(rows[2].contains("\"view_members\":[0,1,5]"), "{json}");
    assert!(rows[2].contains("\"objects\":20"), "{json}");
    let text = cluster_status(&members_file, false);
    assert!(
        text.contains("3 nodes") && text.contains("members 0,1,5"),
        "{text}"
    );
    // `shoal ls --cluster` with that file lists node 5's objects too.
    let ls = shoal()
        .args(["ls", "--cluster", "--json", "--file"])
        .arg(&members_file)
        .output()
        .unwrap();
    assert!(ls.status.success(), "{ls:?}");
    let listed = String::from_utf8(ls.stdout).unwrap();
    assert_eq!(listed.matches("{\"node\":5,").count(), 20, "{listed}");

    // Gone for good: out of the view after its TTL, shown down.
    let _ = n5.kill();
    let killed = Instant::now();
    while view() != "epoch=4 members=0,1" {
        assert!(killed.elapsed() < TTL * 5, "{}", view());
        std::thread::sleep(Duration::from_millis(20));
    }
    let json = cluster_status(&members_file, true);
    assert!(
        json.lines()
            .nth(2)
            .is_some_and(|r| r.contains("\"state\":\"down\"")),
        "{json}"
    );
    drop((c0, c5));
    n1.stop().unwrap();
    n0.stop().unwrap();
}

#[test]
fn a_killed_member_is_removed_after_its_ttl_and_its_homes_move_back() {
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let mut topology = loopback_topology("killed", 3, 16 << 20, Duration::ZERO, dir.path());
    topology.membership = Some(membership(&etcd, "killed"));
    let file = dir.path().join("cluster.toml");
    std::fs::write(&file, topology.to_toml()).unwrap();
    let view = || etcd.get("/shoal/killed/view").unwrap_or_default();

    let n0 = ClusterNode::start(&topology, 0);
    let n1 = ClusterNode::start(&topology, 1);
    let mut serve = shoal();
    serve
        .args(["serve", "--no-prefault", "--node", "2", "--cluster"])
        .arg(&file);
    let n2 = ServeProcess::spawn_node(serve, &topology.nodes[2]);
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
    let status = |json: bool| cluster_status(&file, json);
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

/// Three nodes of one cluster in `etcd`, each with a burst buffer of its own
/// and a backing store in one directory every node sees (a shared file
/// system), as a cluster file; `serve(n)` is the command that runs node n.
struct SharedBacking {
    topology: shoal_cluster::Topology,
    file: std::path::PathBuf,
}

impl SharedBacking {
    fn start(etcd: &EtcdCluster, dir: &std::path::Path, name: &str) -> Self {
        let mut topology = loopback_topology(name, 3, 32 << 20, Duration::ZERO, dir);
        topology.membership = Some(membership(etcd, name));
        for node in &mut topology.nodes {
            node.tiers.burst = Some(dir.join(format!("local-{}", node.id)));
            node.tiers.backing = Some(
                dir.join(format!("shared/{}", node.id))
                    .display()
                    .to_string(),
            );
        }
        let file = dir.join("cluster.toml");
        std::fs::write(&file, topology.to_toml()).unwrap();
        Self { topology, file }
    }

    fn serve(&self, node: u32) -> std::process::Command {
        let mut serve = shoal();
        serve
            .args([
                "serve",
                "--no-prefault",
                "--node",
                &node.to_string(),
                "--cluster",
            ])
            .arg(&self.file);
        serve
    }
}

/// A member stopped cleanly (SIGTERM) leaves the view at once but is
/// expected back: its backing store is not adopted, and it starts again on
/// it with the objects that reached it.
#[test]
fn a_member_stopped_cleanly_is_not_adopted_and_comes_back_with_its_backing_objects() {
    use shoal_core::durability::Durability;

    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let shared = SharedBacking::start(&etcd, dir.path(), "away");
    let view = || etcd.get("/shoal/away/view").unwrap_or_default();
    let (n0, n1) = (
        ServeProcess::spawn_node(shared.serve(0), &shared.topology.nodes[0]),
        ServeProcess::spawn_node(shared.serve(1), &shared.topology.nodes[1]),
    );
    let n2 = ServeProcess::spawn_node(shared.serve(2), &shared.topology.nodes[2]);
    assert_eq!(view(), "epoch=3 members=0,1,2");
    let mut c2 = n2.client();
    let ids: Vec<(ObjectId, u32)> = (500..540u32).map(|s| (ObjectId::random(), s)).collect();
    for &(id, seed) in &ids {
        c2.put_batch(
            &[(id, &pattern(seed)[..], &b""[..])],
            Some(Durability::Backing),
            0,
        )
        .unwrap();
    }
    drop(c2);
    assert!(n2.signal(libc::SIGTERM).success());
    let stopped = Instant::now();
    while view() != "epoch=4 members=0,1" {
        assert!(
            stopped.elapsed() < Duration::from_secs(5),
            "still {:?}",
            view()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Several of the adopter's retries later, nobody serves its store.
    std::thread::sleep(Duration::from_secs(3));
    let json = cluster_status(&shared.file, true);
    assert_eq!(json.matches("\"adopted_objects\":0,").count(), 3, "{json}");
    assert_eq!(json.matches("\"lost_objects\":0,").count(), 3, "{json}");
    let mut c0 = n0.client();
    assert_eq!(read_object(&mut c0, ids[0].0), None, "away");
    // Back on the same store: its objects with it.
    let n2 = ServeProcess::spawn_node(shared.serve(2), &shared.topology.nodes[2]);
    for &(id, seed) in &ids {
        shoal_testing::eventually(&format!("{id} back"), || {
            read_object(&mut c0, id) == Some(pattern(seed))
        });
    }
    drop((c0, n0, n1, n2));
}

/// A member destroyed for good (kill -9, never back) whose backing store the
/// cluster shares: a survivor adopts it and serves every object that reached
/// it, deletes acknowledged before the kill stay deleted, and what was only
/// in its memory or on its own burst buffer is reported lost, by id. The
/// node, started again on the same store, is refused.
#[test]
fn a_member_lost_for_good_has_its_backing_objects_adopted_and_the_rest_reported_lost() {
    use shoal_core::durability::Durability;

    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let shared = SharedBacking::start(&etcd, dir.path(), "adopt");
    let (topology, file, serve) = (&shared.topology, &shared.file, |n| shared.serve(n));
    let view = || etcd.get("/shoal/adopt/view").unwrap_or_default();
    let nodes: Vec<ServeProcess> = (0..3)
        .map(|n| ServeProcess::spawn_node(serve(n), &topology.nodes[n as usize]))
        .collect();
    assert_eq!(view(), "epoch=3 members=0,1,2");
    let [n0, n1, n2]: [ServeProcess; 3] = nodes.try_into().ok().unwrap();
    let (mut c0, mut c1, mut c2) = (n0.client(), n1.client(), n2.client());
    let kept = put_patterns(&mut c0, &mut c1, 0..40);

    // On node 2: objects in its backing store, some deleted again; objects
    // only on its burst buffer; objects only in its memory.
    let put_at = |client: &mut shoal_client::Client, seeds: std::ops::Range<u32>, level| {
        let ids: Vec<(ObjectId, u32)> = seeds.map(|s| (ObjectId::random(), s)).collect();
        let bytes: Vec<Vec<u8>> = ids.iter().map(|&(_, s)| pattern(s)).collect();
        let objects: Vec<(ObjectId, &[u8], &[u8])> = ids
            .iter()
            .zip(&bytes)
            .map(|(&(id, _), b)| (id, b.as_slice(), &b""[..]))
            .collect();
        client.put_batch(&objects, Some(level), 0).unwrap();
        ids
    };
    let durable = put_at(&mut c2, 1000..1300, Durability::Backing);
    let deleted: Vec<ObjectId> = durable.iter().step_by(7).map(|&(id, _)| id).collect();
    for id in &deleted {
        c2.delete(&[*id]).unwrap()[0].as_ref().unwrap();
    }
    // Lost with it, unless the write-behind drain took them down first.
    let mut maybe = put_at(&mut c2, 2000..2020, Durability::Local);
    maybe.extend(put_at(&mut c2, 3000..3020, Durability::Memory));
    for &(id, seed) in durable.iter().skip(1).take(5).chain(&maybe[..5]) {
        assert_eq!(read_object(&mut c0, id), Some(pattern(seed)), "{id}");
    }
    drop(c2);
    // Its witnesses hear of the ids it is home of itself within a heartbeat
    // (docs/cluster.md, "Adoption"): what it sealed in the last one before
    // it died may go unreported.
    std::thread::sleep(topology.heartbeat * 3);

    // Node 2 is destroyed: removed after its TTL, its store adopted.
    let killed = Instant::now();
    let _ = n2.kill();
    while view() != "epoch=4 members=0,1" {
        assert!(killed.elapsed() < TTL * 5, "still {:?}", view());
        std::thread::sleep(Duration::from_millis(20));
    }
    let removed = killed.elapsed();
    let alive: Vec<(ObjectId, u32)> = durable
        .iter()
        .copied()
        .filter(|(id, _)| !deleted.contains(id))
        .collect();
    let mut unread = alive.clone();
    while !unread.is_empty() {
        assert!(
            killed.elapsed() < removed + Duration::from_secs(10),
            "{} of {} backing objects unread 10 s after the removal",
            unread.len(),
            alive.len()
        );
        unread.retain(|&(id, seed)| read_object(&mut c1, id) != Some(pattern(seed)));
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "removed after {removed:?}; its {} backing objects readable {:?} after the removal",
        alive.len(),
        killed.elapsed() - removed
    );
    // From both survivors, whole; deleted and lost ones are not found.
    for &(id, seed) in alive.iter().chain(&kept) {
        assert_eq!(read_object(&mut c0, id), Some(pattern(seed)), "{id}");
        assert_eq!(read_object(&mut c1, id), Some(pattern(seed)), "{id}");
    }
    for id in &deleted {
        assert_eq!(read_object(&mut c0, *id), None, "{id}");
        assert_eq!(read_object(&mut c1, *id), None, "{id}");
    }

    // `shoal cluster status` says who serves them and which ids are lost.
    let status = |json: bool| cluster_status(file, json);
    // Each of the others is served whole (it reached the backing store) or
    // reported lost — never both, never other bytes, never neither: the ids
    // whose home was node 2 itself by their witnesses.
    let json = status(true);
    let (mut served, mut reported) = (0, 0);
    for &(id, seed) in &maybe {
        let listed = json.contains(&id.to_hex());
        match read_object(&mut c0, id) {
            Some(bytes) => {
                assert_eq!(bytes, pattern(seed), "{id}");
                assert!(!listed, "{id} served and reported lost");
                served += 1;
            }
            None => {
                assert!(listed, "{id} neither served nor reported lost: {json}");
                reported += 1;
            }
        }
    }
    for (id, _) in &alive {
        assert!(!json.contains(&id.to_hex()), "{id} listed lost: {json}");
    }
    let text = status(false);
    if reported > 0 {
        assert!(
            text.contains(&format!("lost: {reported} objects")),
            "{text}"
        );
    }
    assert!(
        text.contains(&format!(" {}\n", alive.len() + served)),
        "{text}"
    );
    eprintln!("of {} sealed to burst or memory: {served} reached the backing store, {reported} reported lost", maybe.len());

    // Adopted objects are deleted like any: gone at once, the id free again.
    let (gone, _) = alive[0];
    c0.delete(&[gone]).unwrap()[0].as_ref().unwrap();
    assert_eq!(read_object(&mut c1, gone), None);
    c1.put(gone, b"new", b"").unwrap();
    assert_eq!(read_object(&mut c0, gone).as_deref(), Some(&b"new"[..]));

    // Node 2 started again on the same stores is refused: its backing store
    // belongs to its adopter now.
    let out = serve(2).output().unwrap();
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("was adopted by node"), "{stderr}");
    drop((c0, c1));
    drop((n0, n1));
}
