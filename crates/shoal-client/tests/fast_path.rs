//! The fast path against a real daemon (docs/fast-path.md): gets of sealed
//! objects through the shared index take no round trip and no daemon
//! reference, yet keep their bytes from being evicted or freed by a delete;
//! and a reader killed at any point (SIGKILL, thousands of times in the
//! bench, bounded here) leaves nothing held and nothing corrupted; a shared
//! client's get decides the fast path itself and hands out views.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use shoal_client::shared::{Blocking, ObjectView, OnThisThread, SharedClient};
use shoal_client::Client;
use shoal_core::error::ErrorKind;
use shoal_core::protocol::CreateSpec;
use shoal_core::ObjectId;
use shoal_testing::{eventually, TestDaemon};

/// The bytes object `n` holds: its number, repeated.
fn pattern(n: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (n * 31 + i) as u8).collect()
}

fn put_objects(client: &mut Client, ids: &[ObjectId], len: usize) {
    for (n, id) in ids.iter().enumerate() {
        client.put(*id, &pattern(n, len), b"m").unwrap();
    }
}

#[test]
fn a_get_of_a_sealed_object_takes_no_daemon_reference_and_maps_the_same_bytes() {
    let daemon = TestDaemon::start(8 << 20);
    let mut writer = daemon.client();
    let id = ObjectId::random();
    put_objects(&mut writer, &[id], 1000);
    let mut reader = daemon.client();
    assert!(
        reader.fast_reads().is_some(),
        "the daemon offers the fast path"
    );
    let found = reader.get(&[id], 0).unwrap()[0].unwrap();
    // Zero copy: the bytes are read where the store keeps them.
    let address = reader.located_ptr(found).unwrap();
    assert_eq!(
        address as usize,
        reader.mapping().base() as usize + found.location.offset as usize
    );
    // SAFETY: referenced and mapped.
    let bytes = unsafe { std::slice::from_raw_parts(address, 1000) };
    assert_eq!(bytes, &pattern(0, 1000)[..]);
    // The reference is counted (the daemon's listing sees it)...
    assert_eq!(writer.stats().unwrap().referenced, 1);
    reader.release(&[id]).unwrap();
    assert_eq!(writer.stats().unwrap().referenced, 0);
    // ...but no request was made: a get succeeds while the connection is
    // held by another call.
    let shared = SharedClient::new(daemon.client());
    let (location, held) = shared
        .with(|_connection| Ok(shared.fast_reference(id)))
        .unwrap()
        .expect("served from the index");
    assert_eq!(location, found.location);
    drop(held);
    // An unknown id still takes the socket, and is not found.
    assert!(reader.get(&[ObjectId::random()], 0).unwrap()[0].is_none());
}

#[test]
fn a_held_object_survives_eviction_and_delete_until_its_reader_lets_go() {
    let daemon = TestDaemon::start(8 << 20);
    let mut writer = daemon.client();
    let ids: Vec<ObjectId> = (0..4).map(|_| ObjectId::random()).collect();
    put_objects(&mut writer, &ids, 4096);
    let reader = SharedClient::new(daemon.client());
    let (location, held) = reader.fast_reference(ids[0]).expect("published");
    // Evict everything: the held object stays, where it was.
    writer.evict(u64::MAX).unwrap();
    assert!(writer.contains(ids[0]).unwrap());
    assert!(!writer.contains(ids[1]).unwrap());
    let (again, second) = reader.fast_reference(ids[0]).expect("still published");
    assert_eq!(again, location);
    drop(second);
    // Delete: gone from view at once, its bytes kept for the reader.
    writer.delete(&[ids[0]]).unwrap()[0].as_ref().unwrap();
    assert!(!writer.contains(ids[0]).unwrap());
    assert!(reader.fast_reference(ids[0]).is_none());
    assert!(writer.stats().unwrap().used >= 4096);
    // Created again while its bytes are still held: lent space cannot see a
    // deleted object, so the seal rather than the create is refused
    // (docs/fast-path.md, "Differences from the socket path", case 3), and
    // the reader's bytes stay as they were.
    match writer.create(ids[0], 100, 0, 0) {
        Ok(again) => {
            fill(&mut writer, again, 9);
            let err = writer.seal(&[ids[0]], true).unwrap_err();
            assert_eq!(err.kind(), shoal_core::error::ErrorKind::ObjectExists);
            writer.abort(ids[0]).unwrap();
        }
        Err(err) => assert_eq!(err.kind(), shoal_core::error::ErrorKind::ObjectExists),
    }
    assert!(!writer.contains(ids[0]).unwrap());
    let base = reader.with(|c| Ok(c.mapping().base())).unwrap();
    // SAFETY: `held` keeps the deleted object's bytes mapped and allocated.
    let bytes = unsafe { std::slice::from_raw_parts(base.add(location.offset as usize), 4096) };
    assert_eq!(bytes, &pattern(0, 4096)[..]);
    drop(held);
    eventually("the deleted object's memory", || {
        writer.stats().unwrap().used == 0
    });
}

/// The child's loop: gets, holds and releases objects through the fast
/// path, and creates, seals, aborts and deletes its own, until killed.
fn reader_loop(socket: &Path, ids: &[ObjectId]) -> ! {
    let mut client = Client::connect(socket).unwrap();
    let mut held: Vec<ObjectId> = Vec::new();
    let mut n = std::process::id() as usize;
    loop {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pick = (n >> 33) % 64;
        let id = ids[(n >> 40) % ids.len()];
        match pick {
            0..=39 => {
                if let Some(found) = client.get(&[id], 0).unwrap()[0] {
                    // SAFETY: a referenced object of at least one byte.
                    let first = unsafe { *client.located_ptr(found).unwrap() };
                    std::hint::black_box(first);
                    held.push(id);
                }
            }
            40..=59 => {
                if let Some(id) = held.pop() {
                    client.release(&[id]).unwrap();
                }
            }
            60 | 61 => {
                let own = ObjectId::random();
                let location = client.create(own, 512, 0, 0).unwrap();
                if pick == 60 {
                    client.seal(&[own], true).unwrap();
                    let _ = client.delete(&[own]);
                } else {
                    let _ = location;
                    client.abort(own).unwrap();
                }
            }
            _ => {
                // Mid-create: killed here, the daemon aborts it.
                let _ = client.create(ObjectId::random(), 512, 0, 0);
            }
        }
    }
}

/// Run by the crash test as a child process (a no-op otherwise).
#[test]
fn fast_path_child() {
    let (Ok(socket), Ok(ids)) = (
        std::env::var("SHOAL_FAST_CHILD_SOCKET"),
        std::env::var("SHOAL_FAST_CHILD_IDS"),
    ) else {
        return;
    };
    let ids: Vec<ObjectId> = ids.split(',').filter_map(ObjectId::from_hex).collect();
    reader_loop(Path::new(&socket), &ids);
}

fn spawn_child(socket: &Path, ids: &[ObjectId]) -> Child {
    let hex: Vec<String> = ids.iter().map(ObjectId::to_hex).collect();
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "fast_path_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SHOAL_FAST_CHILD_SOCKET", socket)
        .env("SHOAL_FAST_CHILD_IDS", hex.join(","))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Readers SIGKILLed at random points: after each kill every object is
/// intact, and once the daemon has noticed, no reference stands (all of the
/// store can be evicted) and no byte is leaked (usage returns to zero).
/// `SHOAL_CRASH_KILLS` sets the number of kills (bench: thousands).
#[test]
fn readers_killed_at_random_points_leave_nothing_held_or_corrupted() {
    let kills: usize = std::env::var("SHOAL_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let daemon = TestDaemon::start(8 << 20);
    let mut writer = daemon.client();
    let ids: Vec<ObjectId> = (0..32).map(|_| ObjectId::random()).collect();
    let mut seed = 0x9e37_79b9_u64;
    for round in 0..kills {
        put_objects(&mut writer, &ids, 1000);
        // Two readers at once, so one dies while the other holds the same
        // objects.
        let mut children = [
            spawn_child(daemon.socket(), &ids),
            spawn_child(daemon.socket(), &ids),
        ];
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        std::thread::sleep(Duration::from_millis(20 + (seed >> 58)));
        for child in &mut children {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        // Every object is whole (nothing was freed under a reader, nothing
        // written over).
        for (n, id) in ids.iter().enumerate() {
            let found = writer.get(&[*id], 0).unwrap()[0]
                .unwrap_or_else(|| panic!("round {round}: object {n} lost"));
            // SAFETY: a referenced, sealed object of 1000 bytes, mapped.
            let bytes =
                unsafe { std::slice::from_raw_parts(writer.located_ptr(found).unwrap(), 1000) };
            assert_eq!(bytes, &pattern(n, 1000)[..], "round {round}: object {n}");
            writer.release(&[*id]).unwrap();
        }
        // Once the daemon saw both go: everything can leave memory.
        eventually("the killed readers' references to go", || {
            writer.evict(u64::MAX).unwrap();
            let stats = writer.stats().unwrap();
            stats.used == 0 && stats.clients == 1
        });
    }
}

/// Writes object `n`'s pattern into a created object.
fn fill(client: &mut Client, location: shoal_core::location::ObjectLocation, n: usize) {
    let data = pattern(n, location.data_size as usize);
    client.write(location, &data, &[]).unwrap();
}

#[test]
fn creates_and_seals_in_lent_space_take_no_round_trip_and_behave_like_the_socket() {
    let daemon = TestDaemon::start(64 << 20);
    let mut c = daemon.client();
    assert!(c.has_fast_writes(), "the daemon offers write channels");
    let mut other = daemon.client();
    // The first create asks for a lease; then none of these take a request.
    let first = ObjectId::random();
    let l = c.create(first, 1000, 0, 0).unwrap();
    fill(&mut c, l, 0);
    c.seal(&[first], true).unwrap();
    let before = c.requests();
    let ids: Vec<ObjectId> = (0..100).map(|_| ObjectId::random()).collect();
    for (n, id) in ids.iter().enumerate() {
        let location = c.create(*id, 1000, 0, 0).unwrap();
        fill(&mut c, location, n);
        c.seal(&[*id], false).unwrap();
        let found = c.get(&[*id], 0).unwrap()[0].expect("sealed means found");
        assert_eq!(found.location, location, "the same bytes, not a copy");
        c.release(&[*id, *id]).unwrap(); // the get's and the creator's
    }
    assert_eq!(
        c.requests(),
        before,
        "no request for create, seal, get, release"
    );
    // Everyone sees them, at once, whole; and nothing stays referenced.
    for (n, id) in ids.iter().enumerate() {
        let found = other.get(&[*id], 0).unwrap()[0].expect("visible to others");
        // SAFETY: a referenced, sealed object of 1000 bytes, mapped.
        let bytes = unsafe { std::slice::from_raw_parts(other.located_ptr(found).unwrap(), 1000) };
        assert_eq!(bytes, &pattern(n, 1000)[..]);
        other.release(&[*id]).unwrap();
    }
    // Releases are one-way: the daemon takes them as it polls.
    eventually("the releases", || other.stats().unwrap().referenced == 0);
    let stats = other.stats().unwrap();
    assert_eq!(stats.used, 101 * 1024, "objects only: lent space is apart");
    assert!(stats.lent > 0 && stats.lent <= 1 << 20, "{stats:?}");
    assert_eq!(other.evict(u64::MAX).unwrap(), 101 * 1024);
}

#[test]
fn seals_return_unanswered_yet_deletes_and_contains_anywhere_see_them() {
    let daemon = TestDaemon::start(64 << 20);
    let mut c = daemon.client();
    let mut other = daemon.client();
    let warm = ObjectId::random();
    let l = c.create(warm, 1000, 0, 0).unwrap();
    fill(&mut c, l, 0);
    c.seal(&[warm], true).unwrap();
    let before = c.requests();
    for n in 0..200 {
        let id = ObjectId::random();
        let l = c.create(id, 1000, 0, 0).unwrap();
        fill(&mut c, l, n);
        c.seal(&[id], true).unwrap();
        if n % 2 == 0 {
            // The writer's own get waits for its seal rather than ask the socket.
            let mine = c.get(&[id], 0).unwrap()[0].expect("sealed means found");
            assert_eq!(mine.location, l);
            c.release(&[id]).unwrap();
        }
        // Another client asks right away: the daemon applies the seal
        // record before it answers, by the socket or the write channel.
        assert!(other.contains(id).unwrap(), "round {n}");
        let found = other.get(&[id], 0).unwrap()[0].expect("sealed means found");
        // SAFETY: a referenced, sealed object of 1000 bytes, mapped.
        let bytes = unsafe { std::slice::from_raw_parts(other.located_ptr(found).unwrap(), 1000) };
        assert_eq!(bytes, &pattern(n, 1000)[..], "round {n}");
        other.release(&[id]).unwrap();
        assert!(!other.contains(ObjectId::random()).unwrap());
        // Once delete returns, nobody finds it, by index or socket.
        c.delete(&[id]).unwrap().remove(0).unwrap();
        assert!(other.get(&[id], 0).unwrap()[0].is_none(), "round {n}");
        assert!(!other.contains(id).unwrap(), "round {n}");
        assert!(!c.contains(id).unwrap());
        let again = c.delete(&[id]).unwrap().remove(0).unwrap_err();
        assert_eq!(again.kind(), ErrorKind::ObjectNotFound);
    }
    assert_eq!(
        c.requests(),
        before,
        "create, seal, get, contains and delete through shared memory"
    );
    eventually("the releases", || other.stats().unwrap().referenced == 0);
    assert_eq!(
        other.stats().unwrap().objects,
        1,
        "only the first object left"
    );
}

#[test]
fn duplicate_ids_aborts_and_names_in_lent_space_follow_the_socket_rules() {
    let daemon = TestDaemon::start(64 << 20);
    let mut a = daemon.client();
    let mut b = daemon.client();
    // A sealed id is refused at create.
    let id = ObjectId::random();
    a.put(id, &pattern(1, 100), b"").unwrap();
    let err = a.create(id, 10, 0, 0).unwrap_err();
    assert_eq!(err.kind(), shoal_core::error::ErrorKind::ObjectExists);
    // Two writers of one new id: the second is told (ObjectExists) and its
    // bytes are never seen. Within the daemon's reaction time both creates
    // land in lent space and the second *seal* is refused; once the daemon
    // registered the first create (a loaded machine: it polls later), the
    // second create goes through the socket and is refused there
    // (docs/fast-path.md, "Differences from the socket path").
    let id = ObjectId::random();
    let la = a.create(id, 100, 0, 0).unwrap();
    let lb = b.create(id, 100, 0, 0);
    fill(&mut a, la, 1);
    match lb {
        Ok(lb) => {
            fill(&mut b, lb, 2);
            a.seal(&[id], true).unwrap();
            let err = b.seal(&[id], true).unwrap_err();
            assert_eq!(err.kind(), shoal_core::error::ErrorKind::ObjectExists);
        }
        Err(err) => {
            assert_eq!(err.kind(), shoal_core::error::ErrorKind::ObjectExists);
            a.seal(&[id], true).unwrap();
        }
    }
    let found = b.get(&[id], 0).unwrap()[0].unwrap();
    // SAFETY: a referenced, sealed object of 100 bytes, mapped.
    let bytes = unsafe { std::slice::from_raw_parts(b.located_ptr(found).unwrap(), 100) };
    assert_eq!(bytes, &pattern(1, 100)[..]);
    b.release(&[id]).unwrap();
    // Aborted: gone, and its id free again.
    let id = ObjectId::random();
    a.create(id, 100, 0, 0).unwrap();
    a.abort(id).unwrap();
    assert!(!b.contains(id).unwrap());
    let l = a.create(id, 100, 0, 0).unwrap();
    fill(&mut a, l, 3);
    a.seal(&[id], true).unwrap();
    assert!(b.contains(id).unwrap());
    // A name given while writing is bound at the seal.
    let id = ObjectId::random();
    let l = a.create(id, 100, 0, 0).unwrap();
    a.name(id, "lent/one").unwrap();
    fill(&mut a, l, 4);
    a.seal(&[id], true).unwrap();
    assert_eq!(b.resolve("lent/one").unwrap().id, id);
    // A client that leaves mid-write: what it sealed stays, the rest of its
    // lent space comes back.
    let kept = ObjectId::random();
    let l = b.create(kept, 100, 0, 0).unwrap();
    fill(&mut b, l, 5);
    b.seal(&[kept], true).unwrap();
    b.create(ObjectId::random(), 100, 0, 0).unwrap();
    drop(b);
    eventually("the writer's lent space to come back", || {
        let stats = a.stats().unwrap();
        stats.clients == 1 && stats.lent <= (1 << 20)
    });
    assert!(a.contains(kept).unwrap());
    drop(a);
    let mut c = daemon.client();
    eventually("every lease to come back", || {
        let stats = c.stats().unwrap();
        stats.clients == 1 && stats.lent == 0
    });
    assert_eq!(c.stats().unwrap().used, 5 * 128);
}

/// A client that writes nonsense into its write channel is dropped; the
/// daemon and its other clients go on, and a record naming space the client
/// was not lent is refused without harm.
#[test]
fn a_forged_write_channel_drops_only_its_client() {
    use shoal_core::fast_path::writes::{Record, WriteSender, CHANNEL_BYTES};
    use shoal_core::fd_passing::recv_with_fds;
    use shoal_core::protocol::{Reply, Request, PROTOCOL_VERSION};
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    let daemon = TestDaemon::start(64 << 20);
    let mut good = daemon.client();
    let id = ObjectId::random();
    good.put(id, &pattern(9, 1000), b"").unwrap();

    let mut raw = UnixStream::connect(daemon.socket()).unwrap();
    let call = |raw: &mut UnixStream, request: Request| {
        let mut out = Vec::new();
        request.encode(&mut out);
        raw.write_all(&out).unwrap();
        let mut buf = vec![0u8; 4096];
        let (n, fds) = recv_with_fds(raw.as_fd(), &mut buf).unwrap();
        let header = shoal_core::protocol::FrameHeader::parse(&buf[..n])
            .unwrap()
            .unwrap();
        let len = shoal_core::protocol::FRAME_HEADER_LEN;
        let reply = Reply::decode(header, &buf[len..len + header.len as usize]).unwrap();
        (reply, fds)
    };
    call(
        &mut raw,
        Request::Hello {
            version: PROTOCOL_VERSION,
            pid: std::process::id(),
        },
    );
    let (reply, _) = call(&mut raw, Request::FastReads);
    assert!(matches!(reply, Reply::FastReads { .. }), "{reply:?}");
    let (reply, fds) = call(&mut raw, Request::FastWrites);
    assert!(matches!(reply, Reply::FastWrites { .. }), "{reply:?}");
    let mut sender = WriteSender::attach(fds[0].as_fd()).unwrap();
    // A create in space never lent to it: refused, nothing changes.
    let seq = sender
        .stage(&Record::Create {
            id: ObjectId::random(),
            location: shoal_core::location::ObjectLocation {
                offset: 0,
                data_size: 64,
                meta_size: 0,
            },
        })
        .unwrap()
        .unwrap();
    sender.publish();
    let mut ring = [0u8; 8];
    ring_doorbell(&fds[1]);
    let answer = sender
        .wait(
            seq,
            Duration::from_millis(1),
            Duration::from_secs(5),
            || true,
        )
        .unwrap();
    assert_eq!(answer, Some(shoal_core::error::ErrorKind::InvalidArgument));
    assert_eq!(good.stats().unwrap().objects, 1);
    // Now a record that does not decode: the daemon hangs up on it.
    // SAFETY: a shared mapping of the channel's memfd, CHANNEL_BYTES long.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            CHANNEL_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&fds[0]),
            0,
        )
    } as *mut u8;
    assert_ne!(base as *mut libc::c_void, libc::MAP_FAILED);
    // SAFETY: both writes fall inside the CHANNEL_BYTES mapped above; the
    // tail is an aligned u64 the daemon reads atomically.
    unsafe {
        // Record slot 1 (the ring's records start at byte 192, 64 each):
        // kind 77; then publish tail = 2.
        *base.add(192 + 64) = 77;
        (*base.add(64).cast::<std::sync::atomic::AtomicU64>())
            .store(2, std::sync::atomic::Ordering::SeqCst);
    }
    ring_doorbell(&fds[1]);
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(raw.read(&mut ring).unwrap(), 0, "the daemon closed it");
    // The others are fine.
    let found = good.get(&[id], 0).unwrap()[0].unwrap();
    // SAFETY: a referenced, sealed object of 1000 bytes, mapped.
    let bytes = unsafe { std::slice::from_raw_parts(good.located_ptr(found).unwrap(), 1000) };
    assert_eq!(bytes, &pattern(9, 1000)[..]);
    good.release(&[id]).unwrap();
    let l = good.create(ObjectId::random(), 10, 0, 0).unwrap();
    assert!(l.offset > 0);
}

fn ring_doorbell(fd: &std::os::fd::OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: 8 bytes to an eventfd we were given.
    let n = unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(fd), one.as_ptr().cast(), 8) };
    assert_eq!(n, 8);
}

#[test]
fn a_closed_client_creates_nothing_in_lent_space() {
    let daemon = TestDaemon::start(64 << 20);
    let mut c = daemon.client();
    c.put(ObjectId::random(), b"lent", b"").unwrap();
    c.close();
    let err = c.put(ObjectId::random(), b"after", b"").unwrap_err();
    assert_eq!(err.kind(), shoal_core::error::ErrorKind::Disconnected);
    assert!(c.get(&[ObjectId::random()], 0).is_err());
}

/// A client whose daemon is gone does not hang on a full write channel:
/// creates in lent space stage a record each, and once the ring is full and
/// nobody reads it they fail with `Disconnected` (before the fix, the
/// client waited for room forever, and so did its `close`).
#[test]
fn a_full_write_channel_of_a_gone_daemon_fails_rather_than_hangs() {
    let daemon = TestDaemon::start(64 << 20);
    let mut client = daemon.client();
    assert!(client.has_fast_writes(), "the daemon offers write channels");
    // A lease first, so the creates below need no request.
    let first = ObjectId::random();
    client.create(first, 64, 0, 0).unwrap();
    client.seal(&[first], false).unwrap();
    daemon.stop();
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let records = shoal_core::fast_path::writes::RECORDS as usize;
        let result = (0..2 * records)
            .try_for_each(|_| client.create(ObjectId::random(), 64, 0, 0).map(|_| ()));
        let _ = done.send(result);
    });
    let result = outcome
        .recv_timeout(Duration::from_secs(30))
        .expect("creates into a full write channel of a gone daemon hung");
    let err = result.expect_err("nothing read the ring: a create must fail");
    assert_eq!(
        err.kind(),
        shoal_core::error::ErrorKind::Disconnected,
        "{err}"
    );
}

/// A [`Blocking`] that must not be called: the fast path answered.
struct MustNotWait;

impl Blocking for MustNotWait {
    fn run<R: Send>(self, _call: impl FnOnce() -> R + Send) -> R {
        panic!("the indexes had every object: nothing may wait for the daemon")
    }
}

/// A [`Blocking`] that counts its calls.
struct Counted<'a>(&'a std::cell::Cell<usize>);

impl Blocking for Counted<'_> {
    fn run<R: Send>(self, call: impl FnOnce() -> R + Send) -> R {
        self.0.set(self.0.get() + 1);
        call()
    }
}

/// A view's bytes.
fn bytes(view: &ObjectView) -> &[u8] {
    // SAFETY: the view holds the object's reference and keeps it mapped.
    unsafe { std::slice::from_raw_parts(view.as_ptr(), view.len()) }
}

#[test]
fn a_shared_get_decides_the_fast_path_and_returns_views_of_the_bytes() {
    let daemon = TestDaemon::start(8 << 20);
    let mut writer = daemon.client();
    let ids: Vec<ObjectId> = (0..3).map(|_| ObjectId::random()).collect();
    put_objects(&mut writer, &ids, 1000);
    let shared = SharedClient::new(daemon.client());
    let requests = || shared.with(|c| Ok(c.requests())).unwrap();
    let before = requests();
    // All published: views from the indexes, no request, nothing waits.
    let views = shared.get(&ids, 0, MustNotWait).unwrap();
    assert_eq!(requests(), before);
    let region = shared
        .with(|c| Ok(c.mapping().base() as usize..c.mapping().base() as usize + (8 << 20)))
        .unwrap();
    for (n, view) in views.iter().enumerate() {
        let view = view.as_ref().expect("published");
        assert_eq!(view.id(), ids[n]);
        assert!(!view.is_writable() && view.as_mut_ptr().is_none());
        assert!(
            region.contains(&(view.as_ptr() as usize)),
            "in the region, not a copy"
        );
        assert_eq!(bytes(view), &pattern(n, 1000)[..]);
        let meta = view.metadata();
        assert_eq!((bytes(&meta), meta.id()), (&b"m"[..], ids[n]));
    }
    assert_eq!(writer.stats().unwrap().referenced, 3);
    drop(views);
    assert_eq!(writer.stats().unwrap().referenced, 0);
    assert!(shared.contains(ids[0], MustNotWait).unwrap());

    // One missing: the whole call goes to the daemon, through `blocking`,
    // once; the others are still found, where they were.
    let waits = std::cell::Cell::new(0);
    let missing = ObjectId::random();
    let views = shared.get(&[ids[1], missing], 0, Counted(&waits)).unwrap();
    assert_eq!(waits.get(), 1);
    assert!(views[1].is_none());
    assert_eq!(bytes(views[0].as_ref().unwrap()), &pattern(1, 1000)[..]);
    assert!(!shared.contains(missing, Counted(&waits)).unwrap());
    assert_eq!(waits.get(), 2);
    drop(views);

    // Creates hand out writable views holding the creator's reference.
    let id = ObjectId::random();
    let view = shared.create(id, 100, b"meta", None, 0).unwrap();
    assert!(view.is_writable() && view.len() == 100);
    let address = view.as_mut_ptr().expect("writable");
    // SAFETY: the object is ours until sealed, 100 bytes at `address`.
    unsafe { std::ptr::copy_nonoverlapping(pattern(7, 100).as_ptr(), address, 100) };
    let specs: Vec<CreateSpec> = (0..2)
        .map(|_| CreateSpec {
            id: ObjectId::random(),
            data_size: 10,
            meta_size: 0,
        })
        .collect();
    let batch = shared.create_batch(&specs, 0).unwrap();
    assert!(batch.iter().all(|v| v.is_writable() && v.len() == 10));
    let mut sealed = vec![id];
    sealed.extend(specs.iter().map(|s| s.id));
    shared.seal(&sealed, true).unwrap();
    assert!(view.reference().released() && batch[0].reference().released());
    let got = shared
        .get(&[id], 0, OnThisThread)
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(got.as_ptr(), view.as_ptr(), "read where it was written");
    assert_eq!(bytes(&got), &pattern(7, 100)[..]);
    assert_eq!(bytes(&got.metadata()), b"meta");
    drop((view, batch, got));
    eventually("every reference to go", || {
        writer.stats().unwrap().referenced == 0
    });
}

#[test]
fn a_socket_only_shared_get_returns_the_same_views_through_the_daemon() {
    let daemon = TestDaemon::start(8 << 20);
    let mut writer = daemon.client();
    let ids: Vec<ObjectId> = (0..2).map(|_| ObjectId::random()).collect();
    put_objects(&mut writer, &ids, 500);
    let shared = SharedClient::new(daemon.socket_client());
    let waits = std::cell::Cell::new(0);
    let views = shared.get(&ids, 0, Counted(&waits)).unwrap();
    assert_eq!(waits.get(), 1, "no index: the daemon answers");
    for (n, view) in views.iter().enumerate() {
        assert_eq!(bytes(view.as_ref().unwrap()), &pattern(n, 500)[..]);
    }
    assert_eq!(writer.stats().unwrap().referenced, 2);
    drop(views);
    eventually("the released references", || {
        writer.stats().unwrap().referenced == 0
    });
}
