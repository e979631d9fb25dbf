//! Membership in a real etcd: nodes of the cluster file join a running
//! cluster and leave it, homes follow the members of each view, and no
//! node ever answers with bytes other than the id's current object.

use std::time::Duration;

use shoal_cluster::{MembershipConfig, Topology, View};
use shoal_core::error::ErrorKind;
use shoal_core::ObjectId;
use shoal_testing::{
    eventually, loopback_topology, pattern, put_patterns, read_object, ClusterNode, EtcdCluster,
    TcpProxy,
};

const MIB: u64 = 1 << 20;

/// Three nodes that may be members, their membership in `etcd`.
fn topology(etcd: &EtcdCluster, dir: &std::path::Path) -> Topology {
    let mut topology = loopback_topology("members", 3, 16 * MIB, Duration::ZERO, dir);
    topology.lease = Duration::from_secs(2);
    topology.membership = Some(MembershipConfig {
        url: etcd.url("shoal/members").parse().unwrap(),
        ttl: Duration::from_secs(1),
        grace: Duration::ZERO,
        max_nodes: shoal_cluster::topology::DEFAULT_MAX_NODES,
    });
    topology
}

fn view(etcd: &EtcdCluster) -> String {
    etcd.get("/shoal/members/view").unwrap_or_default()
}

#[test]
fn nodes_join_and_leave_a_running_cluster_and_homes_follow() {
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let topology = topology(&etcd, dir.path());
    let n0 = ClusterNode::start(&topology, 0);
    let n1 = ClusterNode::start(&topology, 1);
    assert_eq!(view(&etcd), "epoch=2 members=0,1");
    let (mut c0, mut c1) = (n0.client(), n1.client());

    // Objects on both nodes, read from the other.
    let objects = put_patterns(&mut c0, &mut c1, 0..120);
    for &(id, seed) in &objects {
        assert_eq!(read_object(&mut c1, id), Some(pattern(seed)), "{id}");
        assert_eq!(read_object(&mut c0, id), Some(pattern(seed)), "{id}");
    }

    // A third node joins: about a third of the homes move to it, and every
    // object stays readable from every node, the newcomer too.
    let n2 = ClusterNode::start(&topology, 2);
    assert_eq!(view(&etcd), "epoch=3 members=0,1,2");
    let mut c2 = n2.client();
    for &(id, seed) in &objects {
        assert_eq!(
            read_object(&mut c2, id),
            Some(pattern(seed)),
            "{id} from the newcomer"
        );
        assert_eq!(read_object(&mut c0, id), Some(pattern(seed)), "{id}");
    }
    // Ids stay unique at their new homes: a create of an existing id fails.
    for &(id, _) in objects.iter().take(30) {
        let err = c2.put(id, b"again", b"").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectExists, "{id}: {err}");
    }
    // The newcomer takes puts; the others read them.
    let mut on_n2 = Vec::new();
    for i in 0..30u32 {
        let id = ObjectId::random();
        c2.put(id, &pattern(1000 + i), b"").unwrap();
        on_n2.push(id);
        assert_eq!(read_object(&mut c1, id), Some(pattern(1000 + i)));
    }
    // Deletes while node 2 is a home: they must stay deleted after it leaves.
    let deleted: Vec<ObjectId> = objects.iter().take(40).map(|&(id, _)| id).collect();
    for &id in &deleted {
        let client = if objects.iter().position(|o| o.0 == id).unwrap() % 2 == 0 {
            &mut c0
        } else {
            &mut c1
        };
        client.delete(&[id]).unwrap()[0].as_ref().unwrap();
    }

    // Node 2 leaves cleanly: its homes go back at once (no lease to wait).
    n2.stop().unwrap();
    eventually("the view without node 2", || {
        view(&etcd) == "epoch=4 members=0,1"
    });
    for &(id, seed) in &objects {
        let want = (!deleted.contains(&id)).then(|| pattern(seed));
        eventually(&format!("{id} as it is now, from node 1"), || {
            read_object(&mut c1, id) == want
        });
        assert_eq!(read_object(&mut c0, id), want, "{id} from node 0");
    }
    // What lived only in node 2's memory is gone, not another object.
    for &id in &on_n2 {
        assert_eq!(read_object(&mut c0, id), None, "{id} lived on node 2 only");
    }
    // A deleted id can be created again, an existing one cannot.
    c0.put(deleted[0], b"new", b"").unwrap();
    assert_eq!(
        read_object(&mut c1, deleted[0]).as_deref(),
        Some(&b"new"[..])
    );
    let (kept, _) = objects[50];
    assert_eq!(
        c1.put(kept, b"again", b"").unwrap_err().kind(),
        ErrorKind::ObjectExists
    );
    drop((c0, c1));
    n1.stop().unwrap();
    n0.stop().unwrap();
}

/// The file of each host lists only the nodes it runs: a node absent from
/// the members' files (id 7, past the others) joins through the record it
/// publishes in etcd. It is admitted with its own key, takes homes and puts;
/// clients that connected before it joined read its objects; the objects
/// of before stay readable and unique; it leaves cleanly.
#[test]
fn a_node_absent_from_the_members_files_joins_through_its_record() {
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let mut all = topology(&etcd, dir.path());
    shoal_testing::with_node_keys(&mut all, dir.path());
    all.nodes[2].id = 7;
    let only = |ids: &[u32]| {
        let mut file = all.clone();
        file.nodes.retain(|n| ids.contains(&n.id));
        file
    };
    let (members_file, newcomer_file) = (only(&[0, 1]), only(&[7]));
    let n0 = ClusterNode::start(&members_file, 0);
    let n1 = ClusterNode::start(&members_file, 1);
    assert_eq!(view(&etcd), "epoch=2 members=0,1");
    let (mut c0, mut c1) = (n0.client(), n1.client());
    let objects = put_patterns(&mut c0, &mut c1, 0..90);

    let n7 = ClusterNode::start(&newcomer_file, 7);
    assert_eq!(view(&etcd), "epoch=3 members=0,1,7");
    // Every node counts the three, those its file lacks too.
    for node in [&n0, &n1, &n7] {
        eventually("three nodes counted", || {
            node.metric("shoal_cluster_nodes") == Some(3.0)
        });
    }
    let newest = View::decode(&view(&etcd)).unwrap();
    let homed_at_7 = objects
        .iter()
        .filter(|(id, _)| newest.home(id) == 7)
        .count();
    assert!(
        homed_at_7 > 0,
        "some of the 90 ids are homed at the newcomer"
    );
    let mut c7 = n7.client();
    for &(id, seed) in &objects {
        assert_eq!(read_object(&mut c7, id), Some(pattern(seed)), "{id} from 7");
    }
    for &(id, _) in objects.iter().take(30) {
        let err = c7.put(id, b"again", b"").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ObjectExists, "{id}: {err}");
    }
    // Its puts, read by clients of nodes whose files lack it (connected
    // before it joined: they learn its region from their daemon).
    let mut on_7 = Vec::new();
    for i in 0..30u32 {
        let id = ObjectId::random();
        c7.put(id, &pattern(2000 + i), b"").unwrap();
        on_7.push(id);
        assert_eq!(read_object(&mut c0, id), Some(pattern(2000 + i)), "{id}");
        assert_eq!(read_object(&mut c1, id), Some(pattern(2000 + i)), "{id}");
    }
    // Creates from the old members land at homes on the newcomer too.
    let more = put_patterns(&mut c0, &mut c1, 500..530);
    for &(id, seed) in &more {
        assert_eq!(read_object(&mut c7, id), Some(pattern(seed)), "{id}");
    }

    n7.stop().unwrap();
    eventually("the view without node 7", || {
        view(&etcd) == "epoch=4 members=0,1"
    });
    for &(id, seed) in objects.iter().chain(&more) {
        eventually(&format!("{id} from node 0"), || {
            read_object(&mut c0, id) == Some(pattern(seed))
        });
    }
    for &id in &on_7 {
        assert_eq!(read_object(&mut c1, id), None, "{id} lived on node 7 only");
    }
    drop((c0, c1, c7));
    n1.stop().unwrap();
    n0.stop().unwrap();
}

/// Puts and gets on the nodes that stay, from a thread per node, while a
/// third node joins and leaves twice: not one fails, and every get reads
/// the bytes that were put.
#[test]
fn creates_and_gets_keep_succeeding_while_a_node_joins_and_leaves() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let topology = topology(&etcd, dir.path());
    let stayers = [
        ClusterNode::start(&topology, 0),
        ClusterNode::start(&topology, 1),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    // Every object put so far, by the node that put it.
    let put: Arc<Mutex<Vec<(ObjectId, u32)>>> = Arc::default();
    let workers: Vec<_> = stayers
        .iter()
        .enumerate()
        .map(|(me, node)| {
            let (mut client, stop, put) = (node.client(), stop.clone(), put.clone());
            std::thread::spawn(move || {
                let mut done = 0u32;
                let mut seed = me as u32 * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    seed += 1;
                    let id = ObjectId::random();
                    client.put(id, &pattern(seed), b"").unwrap();
                    put.lock().unwrap().push((id, seed));
                    // An object of either node, read back whole.
                    let (other, other_seed) = {
                        let all = put.lock().unwrap();
                        all[(seed as usize * 7919) % all.len()]
                    };
                    assert_eq!(
                        read_object(&mut client, other).as_deref(),
                        Some(&pattern(other_seed)[..])
                    );
                    done += 1;
                }
                done
            })
        })
        .collect();
    for round in 0..2 {
        std::thread::sleep(Duration::from_millis(300));
        let joiner = ClusterNode::start(&topology, 2);
        assert_eq!(
            view(&etcd),
            format!("epoch={} members=0,1,2", 3 + 2 * round)
        );
        std::thread::sleep(Duration::from_millis(300));
        joiner.stop().unwrap();
        eventually("node 2 left the view", || {
            view(&etcd) == format!("epoch={} members=0,1", 4 + 2 * round)
        });
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let done: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(done > 100, "the load ran: {done} puts and gets");
    // Afterwards every object is where it was put, once, from either node.
    let mut check = stayers[1].client();
    for &(id, seed) in put.lock().unwrap().iter() {
        assert_eq!(read_object(&mut check, id), Some(pattern(seed)), "{id}");
    }
}

/// Node 2 reaches etcd through a relay the test cuts; its peers it still
/// reaches. The others remove it after its TTL and take its homes; it stops
/// acting as a home before they can, so no id is created twice; after the
/// heal it joins again, and every object is whole and once, its own too.
#[test]
fn a_node_cut_off_from_etcd_alone_stops_acting_as_a_home_until_it_is_back() {
    let etcd = EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    let topology = topology(&etcd, dir.path());
    let relay = TcpProxy::start(etcd.endpoints()[0].parse().unwrap());
    let mut through_relay = topology.clone();
    let url = format!("etcd://127.0.0.1:{}/shoal/members", relay.port());
    through_relay.membership.as_mut().unwrap().url = url.parse().unwrap();
    let n0 = ClusterNode::start(&topology, 0);
    let n1 = ClusterNode::start(&topology, 1);
    let n2 = ClusterNode::start(&through_relay, 2);
    assert_eq!(view(&etcd), "epoch=3 members=0,1,2");
    let (mut c0, mut c1, mut c2) = (n0.client(), n1.client(), n2.client());
    let all_three = View::new(3, [0, 1, 2]).unwrap();
    let homed_at_2 = |count: usize| -> Vec<ObjectId> {
        std::iter::repeat_with(ObjectId::random)
            .filter(|id| all_three.home(id) == 2)
            .take(count)
            .collect()
    };
    let objects = put_patterns(&mut c0, &mut c2, 0..40);

    relay.cut();
    eventually("the others removed node 2", || {
        view(&etcd) == "epoch=4 members=0,1"
    });
    // What operators see: node 2 out of touch on an old view, the others on the new one.
    eventually("node 2 says it is out of touch", || {
        n2.metric("shoal_membership_in_touch") == Some(0.0)
    });
    assert_eq!(n2.metric("shoal_view_epoch"), Some(3.0));
    eventually("node 0 shows the view without node 2", || {
        n0.metric("shoal_view_epoch") == Some(4.0) && n0.metric("shoal_view_members") == Some(2.0)
    });
    let (_, page) = shoal_testing::http_get(n2.metrics, "/").unwrap();
    assert!(
        page.contains("members in view 3 (membership service: out of touch)"),
        "{page}"
    );
    // Ids node 2 was home for: created at their new homes through node 0,
    // and refused through node 2, whose view still makes it their home.
    let contested = homed_at_2(12);
    for (i, &id) in contested.iter().enumerate() {
        c0.put(id, &pattern(100 + i as u32), b"").unwrap();
    }
    for &id in &contested[..3] {
        let refused = c2.put(id, b"a second object", b"");
        assert!(refused.is_err(), "{id} created twice: {refused:?}");
    }

    relay.heal();
    eventually("node 2 joined again", || {
        view(&etcd) == "epoch=5 members=0,1,2"
    });
    eventually("node 2 back in touch on the view of now", || {
        n2.metric("shoal_membership_in_touch") == Some(1.0)
            && n2.metric("shoal_view_epoch") == Some(5.0)
    });
    for (i, &id) in contested.iter().enumerate() {
        let want = Some(pattern(100 + i as u32));
        eventually(&format!("{id} from node 2"), || {
            read_object(&mut c2, id) == want
        });
        assert_eq!(read_object(&mut c1, id), want, "{id}");
        let again = c2.put(id, b"a second object", b"");
        let again = again.expect_err(&format!("contested {i} ({id}) created twice"));
        assert_eq!(again.kind(), ErrorKind::ObjectExists, "{id}: {again}");
    }
    for &(id, seed) in &objects {
        let want = Some(pattern(seed));
        eventually(&format!("{id} from node 1"), || {
            read_object(&mut c1, id) == want
        });
        assert_eq!(read_object(&mut c0, id), want, "{id}");
    }
}

/// Each member of a 3-member etcd killed in turn (one was the leader; a
/// new one is elected within about a second) under puts and gets: the
/// view never changes and not one operation fails.
#[test]
fn etcds_members_killed_in_turn_remove_no_node_and_fail_no_operation() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let mut etcd = EtcdCluster::start(3);
    let dir = tempfile::tempdir().unwrap();
    let topology = topology(&etcd, dir.path());
    let nodes = [0, 1, 2].map(|n| ClusterNode::start(&topology, n));
    assert_eq!(view(&etcd), "epoch=3 members=0,1,2");
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|me| {
            let (mut mine, mut other) = (nodes[me].client(), nodes[me + 1].client());
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut done = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let id = ObjectId::random();
                    let bytes = pattern(done);
                    mine.put(id, &bytes, b"").unwrap();
                    assert_eq!(read_object(&mut other, id), Some(bytes), "{id}");
                    mine.delete(&[id]).unwrap()[0].as_ref().unwrap();
                    done += 1;
                }
                done
            })
        })
        .collect();
    for member in 0..3 {
        etcd.kill(member);
        std::thread::sleep(Duration::from_millis(1500));
        etcd.restart(member);
    }
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let done: u32 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(done > 100, "the load ran: {done}");
    assert_eq!(view(&etcd), "epoch=3 members=0,1,2", "no node was removed");
}
