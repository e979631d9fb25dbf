//! Integration tests: a real daemon on a Unix socket, real clients.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use shoal_client::{Client, Subscription};
use shoal_core::error::{ErrorKind, Result};
use shoal_core::event::ObjectEvent;
use shoal_core::protocol::{Request, PROTOCOL_VERSION};
use shoal_core::ObjectId;
use shoal_daemon::{DaemonConfig, Shutdown};
use shoal_testing::TestDaemon;

#[test]
fn put_get_across_clients_is_zero_copy_and_exact() {
    let daemon = TestDaemon::start(1 << 20);
    let mut writer = daemon.client();
    let mut reader = daemon.client();
    let id = ObjectId::random();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
    writer.put(id, &data, b"meta").unwrap();
    let location = reader.get(&[id], 0).unwrap()[0].unwrap().location;
    assert_eq!(location.offset % 64, 0);
    // SAFETY: we hold a reference until the release below.
    assert_eq!(unsafe { reader.data(location) }, &data[..]);
    assert!(reader.contains(id).unwrap());
    assert_eq!(reader.stats().unwrap().referenced, 1);
    reader.release(&[id]).unwrap();
    assert_eq!(reader.stats().unwrap().referenced, 0);
    assert!(writer.delete(&[id]).unwrap()[0].is_ok());
    assert!(!reader.contains(id).unwrap());
}

#[test]
fn get_blocks_until_sealed_or_times_out() {
    let daemon = TestDaemon::start(1 << 20);
    let id = ObjectId::random();
    let mut reader = daemon.client();
    let started = Instant::now();
    assert_eq!(reader.get(&[id], 50).unwrap(), vec![None]);
    assert!(started.elapsed() >= Duration::from_millis(50));

    let socket = daemon.socket().to_path_buf();
    let writer = std::thread::spawn(move || {
        let mut writer = Client::connect(&socket).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        writer.put(id, b"late", b"").unwrap();
        writer
    });
    let found = reader.get(&[id], 10_000).unwrap();
    assert_eq!(found[0].unwrap().location.data_size, 4);
    drop(writer.join().unwrap());
}

#[test]
fn errors_are_typed_and_change_nothing() {
    let daemon = TestDaemon::start(64 * 1024);
    let mut a = daemon.socket_client();
    let mut b = daemon.socket_client();
    let id = ObjectId::random();
    a.create(id, 100, 0, 0).unwrap();
    assert_eq!(
        b.create(id, 100, 0, 0).unwrap_err().kind(),
        ErrorKind::ObjectExists
    );
    assert_eq!(
        b.seal(&[id], false).unwrap_err().kind(),
        ErrorKind::NotOwner
    );
    assert_eq!(
        b.create(ObjectId::random(), 1 << 20, 0, 0)
            .unwrap_err()
            .kind(),
        ErrorKind::ObjectTooLarge
    );
    a.seal(&[id], false).unwrap();
    assert_eq!(
        a.seal(&[id], false).unwrap_err().kind(),
        ErrorKind::ObjectAlreadySealed
    );
    assert_eq!(
        b.delete(&[ObjectId::random()]).unwrap()[0]
            .as_ref()
            .unwrap_err()
            .kind(),
        ErrorKind::ObjectNotFound
    );
    // Full with everything referenced: StoreFull after the timeout, no hang.
    let big = ObjectId::random();
    b.create(big, 60 * 1024, 0, 0).unwrap();
    let started = Instant::now();
    assert_eq!(
        b.create(ObjectId::random(), 8 * 1024, 0, 200)
            .unwrap_err()
            .kind(),
        ErrorKind::StoreFull
    );
    assert!(
        started.elapsed() >= Duration::from_millis(200)
            && started.elapsed() < Duration::from_secs(5)
    );
    let stats = a.stats().unwrap();
    assert_eq!(stats.objects, 2);
}

#[test]
fn unsealed_objects_resize_in_place_and_bad_resizes_change_nothing() {
    let daemon = TestDaemon::start(64 * 1024);
    let mut a = daemon.socket_client();
    let mut b = daemon.socket_client();
    let x = ObjectId::random();
    let at = a.create(x, 16 * 1024, 0, 0).unwrap();
    let head: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    // SAFETY: our unsealed object of 16 KiB; nobody else writes it.
    unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), a.data_ptr(at), head.len()) };
    // A shrink frees the tail at once.
    assert!(a.resize(x, 4096).unwrap());
    assert_eq!(a.stats().unwrap().used, 4096);
    // A growth takes the free space right after it...
    assert!(a.resize(x, 32 * 1024).unwrap());
    // ...but never another object's, nor beyond the capacity.
    let y = ObjectId::random();
    b.create(y, 16 * 1024, 0, 0).unwrap();
    assert!(!a.resize(x, 60 * 1024).unwrap());
    assert_eq!(a.stats().unwrap().used, 48 * 1024);
    // Typed refusals, each changing nothing.
    let kind = |r: Result<bool>| r.unwrap_err().kind();
    assert_eq!(kind(b.resize(x, 1024)), ErrorKind::NotOwner);
    assert_eq!(
        kind(a.resize(ObjectId::random(), 1024)),
        ErrorKind::ObjectNotFound
    );
    assert_eq!(kind(a.resize(x, 1 << 20)), ErrorKind::ObjectTooLarge);
    let with_meta = ObjectId::random();
    a.create(with_meta, 1024, 16, 0).unwrap();
    assert_eq!(kind(a.resize(with_meta, 512)), ErrorKind::InvalidArgument);
    a.abort(with_meta).unwrap();
    assert_eq!(a.stats().unwrap().used, 48 * 1024);
    // Sealed at its new size, its first bytes where they were written.
    a.seal(&[x], true).unwrap();
    assert_eq!(kind(a.resize(x, 1024)), ErrorKind::ObjectAlreadySealed);
    let found = b.get(&[x], 0).unwrap()[0].unwrap().location;
    assert_eq!((found.offset, found.data_size), (at.offset, 32 * 1024));
    // SAFETY: referenced by the get above.
    assert_eq!(unsafe { &b.data(found)[..4096] }, &head[..]);
}

#[test]
fn files_created_growing_at_once_each_grow_in_place_over_the_socket() {
    let daemon = TestDaemon::start(1 << 20);
    let mut a = daemon.socket_client();
    let mut b = daemon.socket_client();
    let (x, y) = (ObjectId::random(), ObjectId::random());
    let at_x = a.create_growing(x, 4096, 0).unwrap();
    let at_y = b.create_growing(y, 4096, 0).unwrap();
    // The second left room after the first: both grow in place, in turn.
    assert!(at_y.offset >= at_x.offset + 256 * 1024, "{at_x:?} {at_y:?}");
    for kib in (8..=256).step_by(8) {
        assert!(a.resize(x, kib * 1024).unwrap(), "x at {kib} KiB");
        assert!(b.resize(y, kib * 1024).unwrap(), "y at {kib} KiB");
    }
    // A plain create packs in beside the last block: no room is kept for it.
    let z = ObjectId::random();
    let at_z = a.create(z, 4096, 0, 0).unwrap();
    assert!(!a.resize(z, 1 << 19).unwrap(), "{at_z:?}");
    a.seal(&[x, z], true).unwrap();
    b.seal(&[y], true).unwrap();
    assert_eq!(a.stats().unwrap().used, 2 * 256 * 1024 + 4096);
}

#[test]
fn create_waits_for_space_released_by_another_client() {
    let daemon = TestDaemon::start(64 * 1024);
    let mut holder = daemon.client();
    let pinned = ObjectId::random();
    holder.create(pinned, 60 * 1024, 0, 0).unwrap();
    holder.seal(&[pinned], false).unwrap();
    let socket = daemon.socket().to_path_buf();
    let waiter = std::thread::spawn(move || {
        Client::connect(&socket)
            .unwrap()
            .create(ObjectId::random(), 32 * 1024, 0, 5_000)
    });
    std::thread::sleep(Duration::from_millis(100));
    holder.release(&[pinned]).unwrap(); // now evictable: the waiting create evicts it
    assert!(waiter.join().unwrap().is_ok());
    assert!(!holder.contains(pinned).unwrap());
}

#[test]
fn garbage_on_the_socket_drops_only_that_client() {
    let daemon = TestDaemon::start(1 << 20);
    let mut good = daemon.client();
    let id = ObjectId::random();
    good.put(id, b"precious", b"").unwrap();

    // Random bytes before any Hello.
    let mut raw = UnixStream::connect(daemon.socket()).unwrap();
    raw.write_all(&[0x13; 64]).unwrap();
    let mut sink = Vec::new();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(raw.read_to_end(&mut sink).unwrap(), 0, "daemon hung up");

    // A valid Hello, then a truncated Create and a hang-up.
    let mut raw = UnixStream::connect(daemon.socket()).unwrap();
    let mut frame = Vec::new();
    Request::Hello {
        version: PROTOCOL_VERSION,
        pid: 0,
    }
    .encode(&mut frame);
    Request::Create {
        timeout_ms: 0,
        objects: vec![],
        growing: false,
    }
    .encode(&mut frame);
    frame.truncate(frame.len() - 2);
    raw.write_all(&frame).unwrap();
    drop(raw);

    // A frame claiming 4 GiB.
    let mut raw = UnixStream::connect(daemon.socket()).unwrap();
    raw.write_all(&[0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0])
        .unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = raw.read_to_end(&mut sink);

    let mut other = daemon.client();
    let location = other.get(&[id], 0).unwrap()[0].unwrap().location;
    // SAFETY: referenced until the client drops.
    assert_eq!(unsafe { other.data(location) }, b"precious");
    assert_eq!(good.stats().unwrap().objects, 1);
}

#[test]
fn a_vanished_client_has_references_released_and_creations_aborted() {
    let daemon = TestDaemon::start(1 << 20);
    let mut survivor = daemon.client();
    let kept = ObjectId::random();
    survivor.put(kept, b"kept", b"").unwrap();
    {
        let mut doomed = daemon.client();
        doomed.get(&[kept], 0).unwrap();
        doomed.create(ObjectId::random(), 1000, 0, 0).unwrap();
    } // dropped: the socket closes as if the process died
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stats = survivor.stats().unwrap();
        if stats.objects == 1 && stats.referenced == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "references not reclaimed: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(survivor.contains(kept).unwrap());
}

#[test]
fn subscribers_hear_seals_and_removals() {
    let daemon = TestDaemon::start(1 << 20);
    let mut subscription = Subscription::connect(daemon.socket()).unwrap();
    let mut client = daemon.client();
    let id = ObjectId::random();
    client.put(id, b"abc", b"m").unwrap();
    client.delete(&[id]).unwrap();
    let timeout = Some(Duration::from_secs(5));
    assert_eq!(
        subscription.next(timeout).unwrap(),
        Some(ObjectEvent::Sealed {
            id,
            data_size: 3,
            meta_size: 1
        })
    );
    assert_eq!(
        subscription.next(timeout).unwrap(),
        Some(ObjectEvent::Removed { id, deleted: true })
    );
    assert_eq!(
        subscription.next(Some(Duration::from_millis(20))).unwrap(),
        None
    );
}

#[test]
fn a_second_daemon_on_the_same_socket_refuses_to_start() {
    let daemon = TestDaemon::start(1 << 20);
    let config = DaemonConfig::new(daemon.socket(), 1 << 20);
    let err = shoal_daemon::serve_blocking(config, Shutdown::new()).unwrap_err();
    assert!(err.message().contains("another shoal daemon"), "{err}");
    assert!(
        Client::connect(daemon.socket()).is_ok(),
        "the first daemon still serves"
    );
}

#[test]
fn many_small_objects_batch() {
    let daemon = TestDaemon::start(16 << 20);
    let mut client = daemon.client();
    let ids: Vec<_> = (0..5000).map(|_| ObjectId::random()).collect();
    let payload = [7u8; 100];
    let objects: Vec<_> = ids.iter().map(|id| (*id, &payload[..], &[][..])).collect();
    client.put_batch(&objects, None, 0).unwrap();
    let found = client.get(&ids, 0).unwrap();
    assert!(found.iter().all(Option::is_some));
    let mut offsets: Vec<_> = found.iter().map(|l| l.unwrap().location.offset).collect();
    offsets.sort();
    offsets.dedup();
    assert_eq!(
        offsets.len(),
        ids.len(),
        "distinct objects never share memory"
    );
    client.release(&ids).unwrap();
    assert!(client.delete(&ids).unwrap().iter().all(Result::is_ok));
    assert_eq!(client.stats().unwrap().used, 0);
}
