//! Membership against real etcd processes (shoal_testing::EtcdCluster):
//! joins, a clean leave, a member killed (its lease lapses), a node id
//! taken twice, another cluster's prefix, an etcd leader killed.

use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use shoal_core::error::ErrorKind;
use shoal_membership::{Joining, Membership, MembershipUrl, Roster, Settings};
use shoal_testing::EtcdCluster;

const TTL: Duration = Duration::from_secs(1);

fn settings(grace: Duration) -> Settings {
    Settings {
        ttl: TTL,
        grace,
        timeout: Duration::from_secs(1),
    }
}

fn joining(node: u32) -> Joining {
    Joining {
        node,
        incarnation: 100 + u64::from(node),
        record: format!("id = {node}\nrpc = \"127.0.0.1:{}\"\n", 7000 + node),
        stamp: "demo:digest".into(),
    }
}

async fn join(url: &MembershipUrl, node: u32, grace: Duration) -> Membership {
    Membership::join(url, settings(grace), joining(node))
        .await
        .unwrap()
}

/// Waits until `membership`'s roster satisfies `ready`; returns it and how long it took.
async fn until(
    membership: &Membership,
    within: Duration,
    ready: impl Fn(&Roster) -> bool,
) -> (Roster, Duration) {
    let started = Instant::now();
    let mut roster = membership.roster();
    loop {
        {
            let now = roster.borrow_and_update();
            if ready(&now) {
                return (now.clone(), started.elapsed());
            }
        }
        let left = within
            .checked_sub(started.elapsed())
            .unwrap_or_else(|| panic!("not within {within:?}: {:?}", membership.roster().borrow()));
        let _ = tokio::time::timeout(left, roster.changed()).await;
    }
}

async fn keys_under(endpoints: &[String], prefix: &str) -> (usize, i64) {
    let mut client = Client::connect(endpoints, None).await.unwrap();
    let answer = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .unwrap();
    (answer.kvs().len(), answer.header().unwrap().revision())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_leave_and_a_killed_one_is_removed_after_ttl_and_grace() {
    let etcd = EtcdCluster::start(1);
    let url: MembershipUrl = etcd.url("shoal/a").parse().unwrap();
    let grace = Duration::from_millis(500);
    let a = join(&url, 0, grace).await;
    let b = join(&url, 1, grace).await;
    let c = join(&url, 2, grace).await;
    let (roster, _) = until(&a, Duration::from_secs(2), |r| {
        r.view.members() == [0, 1, 2]
    })
    .await;
    assert_eq!(roster.view.epoch(), 3);
    assert_eq!(roster.records.len(), 3);
    assert!(roster.records[&2].contains("7002"));
    assert_eq!(roster.live.get(&1), Some(&101));
    // 2N + 2 keys, and no write in steady state (lease renewals change no key).
    let (count, revision) = keys_under(&etcd.endpoints(), "/shoal/a/").await;
    assert_eq!(count, 2 * 3 + 2);
    tokio::time::sleep(TTL * 3).await;
    assert_eq!(
        keys_under(&etcd.endpoints(), "/shoal/a/").await,
        (count, revision)
    );

    // A clean leave: gone from the view at once, its keys too.
    b.leave().await.unwrap();
    let (roster, took) = until(&a, Duration::from_secs(1), |r| r.view.members() == [0, 2]).await;
    assert!(
        took < Duration::from_millis(300),
        "leave seen after {took:?}"
    );
    assert!(!roster.records.contains_key(&1) && !roster.live.contains_key(&1));
    assert_eq!(
        keys_under(&etcd.endpoints(), "/shoal/a/").await.0,
        2 * 2 + 2
    );

    // Killed (no renewal, no leave): removed after its lease lapses and the grace.
    let killed = Instant::now();
    drop(c);
    let (_, took) = until(&a, TTL * 4, |r| r.view.members() == [0]).await;
    let since = killed.elapsed();
    assert!(since >= grace, "removed before the grace ran: {took:?}");
    assert!(
        since <= TTL + grace + Duration::from_millis(1500),
        "removed after {since:?}"
    );
    // Its record went with the view that removed it: 2N + 2 keys for N = 1.
    assert_eq!(keys_under(&etcd.endpoints(), "/shoal/a/").await.0, 2 + 2);

    // It comes back: joins again under the next epoch.
    let c = join(&url, 2, grace).await;
    let (roster, _) = until(&a, Duration::from_secs(1), |r| r.view.members() == [0, 2]).await;
    assert!(roster.view.epoch() >= 6);
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_within_the_grace_keeps_the_place_and_a_live_duplicate_is_refused() {
    let etcd = EtcdCluster::start(1);
    let url: MembershipUrl = etcd.url("shoal/b").parse().unwrap();
    let grace = Duration::from_secs(5);
    let a = join(&url, 0, grace).await;
    let b = join(&url, 1, grace).await;
    until(&a, Duration::from_secs(2), |r| r.view.members() == [0, 1]).await;
    let epoch = a.roster().borrow().view.epoch();

    // A second daemon as node 1 while node 1 is live: refused after waiting one TTL.
    let err = Membership::join(&url, settings(grace), joining(1))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::ObjectExists, "{err}");

    // kill -9, then a restart before the grace ends: it waits out the old
    // lease and takes its place back; the view never changed.
    drop(b);
    let b = join(&url, 1, grace).await;
    let (roster, _) = until(&a, Duration::from_secs(2), |r| r.live.contains_key(&1)).await;
    assert_eq!(
        (roster.view.epoch(), roster.view.members()),
        (epoch, &[0, 1][..])
    );
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_clusters_prefix_is_refused_and_bad_urls_are_typed() {
    let etcd = EtcdCluster::start(1);
    let url: MembershipUrl = etcd.url("shoal/c").parse().unwrap();
    let _a = join(&url, 0, Duration::ZERO).await;
    let mut other = joining(1);
    other.stamp = "other:digest".into();
    let err = Membership::join(&url, settings(Duration::ZERO), other)
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("another cluster"), "{err}");

    // Nobody listening: a typed error within the timeout, not a hang.
    let port = shoal_testing::free_ports(1)[0];
    let nowhere: MembershipUrl = format!("etcd://127.0.0.1:{port}/shoal/x").parse().unwrap();
    let started = Instant::now();
    let err = Membership::join(&nowhere, settings(Duration::ZERO), joining(0))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_etcds_leader_removes_nobody() {
    shoal_testing::init_logs();
    // The default TTL (3 s): a 3-member etcd here elects a new leader within
    // ~1.3 s of its leader's kill, and each client moves to a live member.
    let mut etcd = EtcdCluster::start(3);
    let url: MembershipUrl = etcd.url("shoal/d").parse().unwrap();
    let grace = Duration::from_secs(1);
    let settings = Settings {
        grace,
        ..Settings::default()
    };
    let a = Membership::join(&url, settings, joining(0)).await.unwrap();
    let b = Membership::join(&url, settings, joining(1)).await.unwrap();
    let (before, _) = until(&a, Duration::from_secs(2), |r| r.view.members() == [0, 1]).await;
    // Every member in turn: one of them was the leader.
    for member in 0..3 {
        etcd.kill(member);
        tokio::time::sleep(settings.ttl + grace * 2).await;
        etcd.restart(member);
    }
    tokio::time::sleep(settings.ttl).await;
    for membership in [&a, &b] {
        let now = membership.roster().borrow().clone();
        assert_eq!(
            now.view, before.view,
            "a view changed while etcd's leader moved"
        );
        assert!(now.connected);
    }
}
