//! A member of a cluster whose membership is in etcd: it joins (its record,
//! a lease-bound liveness key, itself added to the view), keeps its lease,
//! follows every change of the cluster's keys, proposes what its
//! [`Steward`] decides, and leaves.
//!
//! Nothing here runs on the data path: the daemon reads the latest
//! [`Roster`] from a `watch` channel.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, PutOptions, Txn,
    TxnOp, WatchOptions,
};
use futures_util::StreamExt;
use shoal_cluster::View;
use shoal_core::error::{ErrorKind, Result, ShoalError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::keys::{Key, Keys};
use crate::repeated::Repeated;
use crate::roster::{Roster, Steward};
use shoal_cluster::membership_url::MembershipUrl;

/// How a member keeps its place.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// The lease's time to live: a node that stops renewing it (killed,
    /// cut off from etcd) loses its liveness key this long after its last
    /// renewal. Whole seconds (etcd's unit), at least 1.
    pub ttl: Duration,
    /// How long a member may be without its liveness key before the others
    /// remove it from the view (a restart within it keeps the node's place).
    pub grace: Duration,
    /// How long one request to etcd may take.
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(3),
            grace: Duration::ZERO,
            timeout: Duration::from_secs(2),
        }
    }
}

/// Who is joining.
#[derive(Debug, Clone)]
pub struct Joining {
    pub node: u32,
    /// This run of the node (its region's generation): a restart is a new one.
    pub incarnation: u64,
    /// Its `[[node]]` table (TOML), as the other members will read it.
    pub record: String,
    /// The cluster's name and a digest of its token: every member must
    /// bring the same (`Topology::membership_stamp`).
    pub stamp: String,
}

/// This node's membership: alive until [`Membership::leave`] or drop (a
/// drop stops renewing, so the node is removed after its TTL and grace).
pub struct Membership {
    client: Client,
    keys: Keys,
    me: u32,
    lease: i64,
    roster: watch::Receiver<Roster>,
    renewed: RenewalClock,
    tasks: Vec<JoinHandle<()>>,
}

/// When this node's lease was last renewed, read at any moment (the
/// roster's `connected` changes only when a renewal attempt ends, which
/// may take the request timeout).
#[derive(Debug, Clone)]
pub struct RenewalClock(Arc<Mutex<Instant>>);

impl RenewalClock {
    fn new() -> Self {
        Self(Arc::new(Mutex::new(Instant::now())))
    }

    fn renewed(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// How long ago the lease was last renewed.
    pub fn since(&self) -> Duration {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).elapsed()
    }
}

fn unavailable(url: &MembershipUrl, err: impl std::fmt::Display) -> ShoalError {
    ShoalError::new(
        ErrorKind::NodeUnavailable,
        format!("membership {url}: {err}"),
    )
}

fn text(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.value()).into_owned()
}

impl Membership {
    /// Joins the cluster at `url` as `joining.node`. Fails with
    /// `InvalidArgument` if the prefix belongs to another cluster (or token, or max_nodes),
    /// `ObjectExists` if another daemon is live as this node (its liveness
    /// key outlived two TTLs of waiting: a killed predecessor's lapses within
    /// them), `NodeUnavailable` if etcd does not answer.
    pub async fn join(url: &MembershipUrl, settings: Settings, joining: Joining) -> Result<Self> {
        let options = ConnectOptions::new()
            .with_connect_timeout(settings.timeout)
            .with_timeout(settings.timeout)
            .with_keep_alive(settings.ttl / 3, settings.timeout);
        let mut client = Client::connect(&url.endpoints, Some(options))
            .await
            .map_err(|e| unavailable(url, e))?;
        let keys = Keys::new(&url.prefix);
        let me = joining.node;

        // The prefix is this cluster's, or nobody's yet.
        let claim = Txn::new()
            .when([Compare::create_revision(
                keys.cluster(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(keys.cluster(), joining.stamp.clone(), None)])
            .or_else([TxnOp::get(keys.cluster(), None)]);
        let answer = client.txn(claim).await.map_err(|e| unavailable(url, e))?;
        if !answer.succeeded() {
            let found = get_one(&answer);
            if found.as_deref() != Some(joining.stamp.as_str()) {
                return Err(ShoalError::invalid(format!(
                    "membership {url} belongs to another cluster, or this node has another token or max_nodes: \
                     it holds {:?}, this node brings {:?}",
                    found.unwrap_or_default(),
                    joining.stamp
                )));
            }
        }

        let ttl = settings.ttl.as_secs().max(1) as i64;
        // A predecessor killed without leaving keeps its liveness key until
        // its lease lapses, up to a TTL after its last renewal, and etcd's
        // leader notices the lapse on its next check (every 500 ms): wait
        // two TTLs and a second, no longer. Each try takes a fresh lease, so
        // the one that wins has its whole TTL ahead of it.
        let deadline = Instant::now() + settings.ttl * 2 + Duration::from_secs(1);
        let lease = loop {
            let lease = client
                .lease_grant(ttl, None)
                .await
                .map_err(|e| unavailable(url, e))?
                .id();
            let put = Txn::new()
                .when([Compare::create_revision(keys.live(me), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(
                        keys.live(me),
                        joining.incarnation.to_string(),
                        Some(PutOptions::new().with_lease(lease)),
                    ),
                    TxnOp::put(keys.node(me), joining.record.clone(), None),
                ])
                .or_else([TxnOp::get(keys.live(me), None)]);
            let answer = client.txn(put).await.map_err(|e| unavailable(url, e))?;
            if answer.succeeded() {
                break lease;
            }
            let _ = client.lease_revoke(lease).await;
            if Instant::now() >= deadline {
                return Err(ShoalError::new(
                    ErrorKind::ObjectExists,
                    format!(
                        "membership {url}: node {me} is live already (incarnation {}): another \
                         daemon runs as this node",
                        get_one(&answer).unwrap_or_default()
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };

        let (mut roster, revision) = snapshot(&mut client, &keys)
            .await
            .map_err(|e| unavailable(url, e))?;
        // Add this node to the view (or found it) before anyone may count on
        // it; the roster a member starts with has the view with it.
        loop {
            let next = if roster.view_revision == 0 {
                View::new(1, [me])?
            } else {
                match roster.view.next(&[me], &[]) {
                    Some(next) => next,
                    None => break,
                }
            };
            if let Some(written) = propose(&mut client, &keys, roster.view_revision, &next)
                .await
                .map_err(|e| unavailable(url, e))?
            {
                roster.view = next;
                roster.view_revision = written;
                break;
            }
            roster = snapshot(&mut client, &keys)
                .await
                .map_err(|e| unavailable(url, e))?
                .0;
        }
        let (sender, receiver) = watch::channel(roster.clone());
        let renewed = RenewalClock::new();
        tracing::info!(node = me, %url, "joined the cluster's membership");

        let tasks = vec![
            tokio::spawn(follow(
                client.clone(),
                keys.clone(),
                revision,
                sender.clone(),
            )),
            tokio::spawn(renew(
                client.clone(),
                keys.clone(),
                joining.clone(),
                lease,
                settings,
                sender,
                renewed.clone(),
            )),
            tokio::spawn(steward(
                client.clone(),
                keys.clone(),
                settings.grace,
                receiver.clone(),
            )),
        ];
        Ok(Self {
            client,
            keys,
            me,
            lease,
            roster: receiver,
            renewed,
            tasks,
        })
    }

    /// The latest roster; changes wake `changed()`.
    pub fn roster(&self) -> watch::Receiver<Roster> {
        self.roster.clone()
    }

    /// When the lease was last renewed.
    pub fn renewals(&self) -> RenewalClock {
        self.renewed.clone()
    }

    /// Leaves at once: the liveness key and the record go, then the view
    /// without this node is proposed (the others would otherwise wait out
    /// the grace).
    pub async fn leave(mut self) -> Result<()> {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let fail = |e: etcd_client::Error| {
            ShoalError::new(
                ErrorKind::NodeUnavailable,
                format!("membership: leave: {e}"),
            )
        };
        self.client.lease_revoke(self.lease).await.map_err(fail)?;
        self.client
            .delete(self.keys.node(self.me), None)
            .await
            .map_err(fail)?;
        loop {
            let (roster, _) = snapshot(&mut self.client, &self.keys).await.map_err(fail)?;
            let Some(next) = roster.view.next(&[], &[self.me]) else {
                break;
            };
            if propose(&mut self.client, &self.keys, roster.view_revision, &next)
                .await
                .map_err(fail)?
                .is_some()
            {
                break;
            }
        }
        tracing::info!(node = self.me, "left the cluster's membership");
        Ok(())
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn get_one(answer: &etcd_client::TxnResponse) -> Option<String> {
    answer.op_responses().into_iter().find_map(|op| match op {
        etcd_client::TxnOpResponse::Get(get) => get.kvs().first().map(text),
        _ => None,
    })
}

/// Writes `next` if the view is still at `revision` (0: absent); the
/// revision it was written at, or `None` if another view won.
async fn propose(
    client: &mut Client,
    keys: &Keys,
    revision: i64,
    next: &View,
) -> std::result::Result<Option<i64>, etcd_client::Error> {
    propose_removing(client, keys, revision, next, &[]).await
}

/// [`propose`], also deleting the records of `removed` (members without a
/// liveness key), so etcd keeps only the members' keys: only if none of
/// them is live again, else nothing is written.
async fn propose_removing(
    client: &mut Client,
    keys: &Keys,
    revision: i64,
    next: &View,
    removed: &[u32],
) -> std::result::Result<Option<i64>, etcd_client::Error> {
    let mut compares = vec![if revision == 0 {
        Compare::create_revision(keys.view(), CompareOp::Equal, 0)
    } else {
        Compare::mod_revision(keys.view(), CompareOp::Equal, revision)
    }];
    let mut writes = vec![TxnOp::put(keys.view(), next.encode(), None)];
    for &node in removed {
        compares.push(Compare::create_revision(
            keys.live(node),
            CompareOp::Equal,
            0,
        ));
        writes.push(TxnOp::delete(keys.node(node), None));
    }
    let txn = Txn::new().when(compares).and_then(writes);
    let answer = client.txn(txn).await?;
    if !answer.succeeded() {
        return Ok(None);
    }
    tracing::info!(view = %next, "proposed the view");
    Ok(Some(answer.header().map_or(0, |h| h.revision())))
}

/// Every key of the cluster, read at one revision.
async fn snapshot(
    client: &mut Client,
    keys: &Keys,
) -> std::result::Result<(Roster, i64), etcd_client::Error> {
    let answer = client
        .get(keys.all(), Some(GetOptions::new().with_prefix()))
        .await?;
    let revision = answer.header().map_or(0, |h| h.revision());
    let mut roster = Roster {
        view: View::of_file(1),
        view_revision: 0,
        records: BTreeMap::new(),
        live: BTreeMap::new(),
        connected: true,
        current: true,
    };
    for kv in answer.kvs() {
        apply(&mut roster, keys, kv, false);
    }
    Ok((roster, revision))
}

/// One key's new value (or its deletion) into the roster.
fn apply(roster: &mut Roster, keys: &Keys, kv: &KeyValue, deleted: bool) {
    match keys.parse(kv.key()) {
        Some(Key::View) if !deleted => match View::decode(&text(kv)) {
            Ok(view) => {
                roster.view = view;
                roster.view_revision = kv.mod_revision();
            }
            Err(err) => {
                tracing::error!(%err, "the cluster's view key does not decode; kept the last view")
            }
        },
        Some(Key::Node(node)) if deleted => {
            roster.records.remove(&node);
        }
        Some(Key::Node(node)) => {
            roster.records.insert(node, text(kv));
        }
        Some(Key::Live(node)) if deleted => {
            roster.live.remove(&node);
        }
        Some(Key::Live(node)) => {
            roster.live.insert(node, text(kv).parse().unwrap_or(0));
        }
        _ => {}
    }
}

/// Follows the cluster's keys from `revision` on; after a broken watch
/// (etcd restarted, compacted past it) reads everything again.
async fn follow(mut client: Client, keys: Keys, mut revision: i64, roster: watch::Sender<Roster>) {
    let mut read_failures = Repeated::default();
    let mut watch_failures = Repeated::default();
    loop {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        match client.watch(keys.all(), Some(options)).await {
            Ok(mut stream) => {
                if let Some(failures) = watch_failures.over() {
                    tracing::info!(failures, "membership: watching the cluster's keys again");
                }
                while let Some(message) = stream.next().await {
                    let Ok(message) = message else { break };
                    if message.canceled() || message.compact_revision() > 0 {
                        break;
                    }
                    roster.send_modify(|r| {
                        for event in message.events() {
                            if let Some(kv) = event.kv() {
                                apply(r, &keys, kv, event.event_type() == EventType::Delete);
                                revision = revision.max(kv.mod_revision());
                            }
                        }
                    });
                }
            }
            Err(err) => {
                if let Some(times) = watch_failures.happened() {
                    tracing::warn!(%err, times, "membership: watch failed; retrying");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        // The roster may miss changes until everything is read again.
        roster.send_if_modified(|r| std::mem::replace(&mut r.current, false));
        loop {
            match snapshot(&mut client, &keys).await {
                Ok((fresh, at)) => {
                    if let Some(failures) = read_failures.over() {
                        tracing::info!(failures, "membership: the cluster's keys are read again");
                    }
                    revision = at;
                    roster.send_modify(|r| {
                        let connected = r.connected;
                        *r = fresh;
                        r.connected = connected;
                    });
                    break;
                }
                Err(err) => {
                    if let Some(times) = read_failures.happened() {
                        tracing::warn!(%err, times, "membership: reading the cluster's keys failed; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }
}

/// How soon a failed renewal is tried again.
const RETRY: Duration = Duration::from_millis(100);

/// Whether etcd said the lease does not exist (it lapsed, or was revoked).
fn lease_gone(err: &etcd_client::Error) -> bool {
    err.to_string().contains("lease not found")
}

/// Renews the lease every TTL/3 and says whether it was renewed within one
/// TTL. A lease that lapsed (etcd answered with TTL 0: the others may have
/// removed this node) is replaced by a new one and the liveness key put
/// again, so the node joins again.
async fn renew(
    mut client: Client,
    keys: Keys,
    joining: Joining,
    mut lease: i64,
    settings: Settings,
    roster: watch::Sender<Roster>,
    clock: RenewalClock,
) {
    let me = joining.node;
    let ttl = settings.ttl.as_secs().max(1) as i64;
    let mut renewed = Instant::now();
    let mut keeper = None;
    // After a failure, try again soon: the client's next request may go to
    // another etcd member (one was killed, or lost its leader).
    let mut wait = settings.ttl / 3;
    let mut renew_failures = Repeated::default();
    loop {
        tokio::time::sleep(wait).await;
        wait = RETRY;
        let mut lapsed = false;
        if keeper.is_none() {
            match client.lease_keep_alive(lease).await {
                Ok(opened) => keeper = Some(opened),
                Err(err) => {
                    lapsed = lease_gone(&err);
                    if let Some(times) = renew_failures.happened() {
                        tracing::warn!(node = me, %err, times, "membership: renewing the lease failed");
                    }
                }
            }
        }
        if let Some((sender, stream)) = keeper.as_mut() {
            let answered = tokio::time::timeout(settings.timeout, async {
                sender.keep_alive().await?;
                stream.message().await
            })
            .await;
            match answered {
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                    if let Some(failures) = renew_failures.over() {
                        tracing::info!(
                            node = me,
                            failures,
                            "membership: the lease is renewed again"
                        );
                    }
                    renewed = Instant::now();
                    clock.renewed();
                    wait = settings.ttl / 3;
                }
                Ok(Ok(Some(_))) => lapsed = true,
                failed => {
                    let why = match failed {
                        Ok(Err(err)) => {
                            lapsed = lease_gone(&err);
                            err.to_string()
                        }
                        Ok(Ok(None)) => "the stream ended".to_owned(),
                        _ => "no answer in time".to_owned(),
                    };
                    if let Some(times) = renew_failures.happened() {
                        tracing::warn!(node = me, %why, times, "membership: renewing the lease failed");
                    }
                    keeper = None;
                }
            }
        }
        if lapsed {
            tracing::warn!(node = me, "membership: the lease lapsed; joining again");
            let rejoined = async {
                let new = client.lease_grant(ttl, None).await?.id();
                client
                    .put(
                        keys.live(me),
                        joining.incarnation.to_string(),
                        Some(PutOptions::new().with_lease(new)),
                    )
                    .await?;
                client
                    .put(keys.node(me), joining.record.clone(), None)
                    .await?;
                Ok::<_, etcd_client::Error>(new)
            }
            .await;
            match rejoined {
                Ok(new) => {
                    lease = new;
                    renewed = Instant::now();
                    clock.renewed();
                    keeper = None;
                    wait = settings.ttl / 3;
                }
                Err(err) => tracing::warn!(node = me, %err, "membership: joining again failed"),
            }
        }
        let connected = renewed.elapsed() < settings.ttl;
        roster.send_if_modified(|r| {
            let changed = r.connected != connected;
            r.connected = connected;
            changed
        });
    }
}

/// Proposes the view changes the steward decides, as the roster changes
/// and when a member's grace runs out.
async fn steward(
    mut client: Client,
    keys: Keys,
    grace: Duration,
    mut roster: watch::Receiver<Roster>,
) {
    let mut steward = Steward::new(grace);
    loop {
        let now_roster = roster.borrow_and_update().clone();
        let (proposal, wake) = steward.propose(&now_roster, Instant::now());
        let mut sleep = wake.map_or(Duration::from_secs(3600), |w| {
            w.saturating_duration_since(Instant::now())
        });
        if let Some(next) = proposal {
            // A lost compare-and-swap needs nothing: the watch brings the
            // view that won, and the roster's change wakes this loop.
            let removed: Vec<u32> = now_roster
                .view
                .members()
                .iter()
                .copied()
                .filter(|&m| !next.contains(m))
                .collect();
            let proposed = propose_removing(
                &mut client,
                &keys,
                now_roster.view_revision,
                &next,
                &removed,
            )
            .await;
            if let Err(err) = proposed {
                tracing::warn!(%err, view = %next, "membership: proposing the view failed; retrying");
                sleep = sleep.min(Duration::from_millis(500));
            }
        }
        tokio::select! {
            changed = roster.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}
