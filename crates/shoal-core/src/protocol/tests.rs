use super::*;
use crate::error::ErrorKind;
use crate::event::ObjectEvent;
use crate::ids::ObjectId;
use crate::location::ObjectLocation;
use proptest::prelude::*;

fn round_trip_request(request: Request) {
    let mut buf = Vec::new();
    request.encode(&mut buf);
    let (decoded, used) = decode_request(&buf).unwrap().unwrap();
    assert_eq!(decoded, request);
    assert_eq!(used, buf.len());
    // Every strict prefix asks for more bytes or fails cleanly; never panics.
    for cut in 0..buf.len() {
        assert!(matches!(decode_request(&buf[..cut]), Ok(None)));
    }
}

fn round_trip_reply(reply: Reply) {
    let mut buf = Vec::new();
    reply.encode(&mut buf);
    let header = FrameHeader::parse(&buf).unwrap().unwrap();
    assert_eq!(header.len as usize, buf.len() - FRAME_HEADER_LEN);
    assert_eq!(
        Reply::decode(header, &buf[FRAME_HEADER_LEN..]).unwrap(),
        reply
    );
}

/// One of every request (doc_check.rs reads their sizes too).
pub(super) fn sample_requests() -> Vec<Request> {
    let ids = vec![ObjectId::random(), ObjectId::random()];
    vec![
        Request::Hello {
            version: PROTOCOL_VERSION,
            pid: 77,
        },
        Request::Create {
            timeout_ms: 5,
            objects: vec![CreateSpec {
                id: ids[0],
                data_size: 1 << 40,
                meta_size: 9,
            }],
            growing: true,
        },
        Request::Seal {
            release: true,
            durability: None,
            ids: ids.clone(),
        },
        Request::Seal {
            release: false,
            durability: Some(crate::durability::Durability::Backing),
            ids: ids.clone(),
        },
        Request::WaitDurable {
            level: crate::durability::Durability::Local,
            timeout_ms: 250,
            ids: ids.clone(),
        },
        Request::StageIn { ids: ids.clone() },
        Request::StageOut { ids: vec![] },
        Request::Cool { ids: vec![] },
        Request::Tiers,
        Request::Name {
            id: ids[0],
            name: "runs/1/table.arrow".into(),
        },
        Request::Resolve {
            name: "runs/1/table.arrow".into(),
        },
        Request::ListNames { prefix: "".into() },
        Request::Rename {
            from: "runs/1".into(),
            to: "runs/2".into(),
        },
        Request::Unlink { name: "x".into() },
        Request::SetMtime {
            name: "x".into(),
            mtime_ms: 978_307_200_000,
        },
        Request::Capacity { trace_since: None },
        Request::Capacity {
            trace_since: Some(std::time::Duration::from_millis(1500)),
        },
        Request::Abort { id: ids[1] },
        Request::Resize {
            id: ids[0],
            data_size: u64::MAX,
        },
        Request::Get {
            timeout_ms: WAIT_FOREVER,
            ids: ids.clone(),
        },
        Request::Release { ids: ids.clone() },
        Request::Delete { ids: vec![] },
        Request::Contains { id: ids[0] },
        Request::List,
        Request::Stats,
        Request::Subscribe,
        Request::Evict { bytes: 12345 },
        Request::ClusterInfo,
        Request::FastReads,
        Request::FastWrites,
        Request::Lend { bytes: 1 << 20 },
        Request::PeerReads,
        Request::CreateOn {
            node: 3,
            timeout_ms: 10,
            objects: vec![CreateSpec {
                id: ObjectId::random(),
                data_size: 7,
                meta_size: 1,
            }],
        },
    ]
}

#[test]
fn every_request_round_trips() {
    for request in sample_requests() {
        round_trip_request(request);
    }
}

/// One of every reply (doc_check.rs reads their sizes too).
pub(super) fn sample_replies() -> Vec<Reply> {
    let id = ObjectId::random();
    let loc = ObjectLocation {
        offset: 64,
        data_size: 1000,
        meta_size: 3,
    };
    vec![
        Reply::Ok,
        Reply::Error {
            kind: ErrorKind::StoreFull,
            message: "full ✓".into(),
        },
        Reply::Welcome {
            version: 1,
            client_id: 3,
            region_size: 1 << 30,
            capacity: 1 << 29,
            line_size: 64,
            resident: true,
            clustered: true,
        },
        Reply::Created {
            generation: 0,
            offsets: vec![0, 64, 128],
        },
        Reply::Created {
            generation: u64::MAX - 1,
            offsets: vec![4096],
        },
        Reply::Staged {
            offsets: vec![0, 8192],
        },
        Reply::Objects {
            objects: vec![
                Some(Located {
                    node: 2,
                    generation: 0x1234_5678_9abc_def0,
                    location: loc,
                    invalidate: false,
                }),
                None,
                Some(Located::local(0, loc)),
                Some(Located {
                    invalidate: true,
                    ..Located::local(0, loc)
                }),
            ],
        },
        Reply::ClusterInfo {
            node: 1,
            coherent: false,
            simulated: true,
            cluster: "name=c token-sha256=00ff".into(),
            encryption: "tls1.3, data channel tls-userspace".into(),
            nodes: vec![PeerRegion {
                node: 0,
                mapped: true,
                alive: false,
                region_size: 1 << 20,
                path: "/dev/shm/n0".into(),
            }],
        },
        Reply::Bool(true),
        Reply::FastReads { slots: 1 << 16 },
        Reply::FastWrites { records: 256 },
        Reply::PeerReads {
            owners: vec![(0, 7), (2, u64::MAX)],
        },
        Reply::Lent {
            lease: 3,
            offset: 4096,
            len: 1 << 20,
        },
        Reply::List {
            objects: vec![ObjectInfo {
                id,
                location: loc,
                sealed: true,
                refs: 2,
                resident: false,
                tiers: 3,
            }],
        },
        Reply::Stats(StoreStats {
            capacity: 1,
            used: 2,
            policy: "lru",
            ..Default::default()
        }),
        Reply::Stats(StoreStats {
            policy: "lrfu",
            ..Default::default()
        }),
        Reply::Notification(ObjectEvent::Sealed {
            id,
            data_size: 5,
            meta_size: 1,
        }),
        Reply::Notification(ObjectEvent::Removed { id, deleted: false }),
        Reply::Notification(ObjectEvent::Removed { id, deleted: true }),
        Reply::Notification(ObjectEvent::Aborted { id }),
        Reply::Statuses {
            errors: vec![None, Some(ErrorKind::ObjectNotFound)],
        },
        Reply::Evicted { bytes: 7 },
        Reply::Tiers(TierReport::default()),
        Reply::Named(NameEntry {
            name: "a/b".into(),
            id,
            data_size: 1 << 35,
            meta_size: 3,
            mtime_ms: 1_790_000_000_000,
        }),
        Reply::Names { entries: vec![] },
        Reply::Names {
            entries: vec![
                NameEntry {
                    name: "a".into(),
                    id,
                    data_size: 0,
                    meta_size: 0,
                    mtime_ms: 0,
                },
                NameEntry {
                    name: "é/ü".into(),
                    id,
                    data_size: 9,
                    meta_size: 1,
                    mtime_ms: 2,
                },
            ],
        },
        Reply::Capacity(CapacityReport::default()),
        Reply::Capacity(CapacityReport {
            enabled: true,
            source: "meminfo /tmp/fake".into(),
            interval: std::time::Duration::from_millis(100),
            threshold: 0.95,
            gain: 0.5,
            max_capacity: 8 << 30,
            target: 3 << 30,
            capacity: 3 << 30,
            used: 1 << 30,
            over_target: true,
            utilisation: 0.97,
            last_step: -(1 << 28),
            stall_share: Some(0.02),
            psi_action: PsiAction::HoldGrowth,
            steps: 12,
            cpu_seconds: 0.25,
            release_cpu_seconds: 0.125,
            urgent_steps: 7,
            trace: vec![TracePoint {
                time: std::time::Duration::from_millis(100),
                target: 5,
                capacity: 6,
                store_used: 4,
                node_used: 90,
                node_total: 100,
                utilisation: 0.9,
            }],
            ..Default::default()
        }),
        Reply::Tiers(TierReport {
            default_durability: crate::durability::Durability::Local,
            queue_depth: 3,
            drained_bytes: 1 << 33,
            drain_rate: 5,
            tiers: vec![
                TierInfo {
                    level: 0,
                    describe: "/nvme/shoal".into(),
                    capacity: 10,
                    used: 4,
                    objects: 2,
                },
                TierInfo {
                    level: 1,
                    describe: "s3://bucket/prefix".into(),
                    capacity: u64::MAX,
                    used: 0,
                    objects: 0,
                },
            ],
            ..Default::default()
        }),
    ]
}

#[test]
fn every_reply_round_trips() {
    for reply in sample_replies() {
        round_trip_reply(reply);
    }
}

#[test]
fn malformed_frames_are_typed_errors() {
    let kind = |bytes: &[u8]| decode_request(bytes).unwrap_err().kind();
    // Unknown opcode.
    assert_eq!(kind(&[0, 0, 0, 0, 0x7f, 0, 0, 0]), ErrorKind::Protocol);
    // Oversized frame is refused from the header alone.
    assert_eq!(
        kind(&[0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0]),
        ErrorKind::Protocol
    );
    // Unknown flags.
    assert_eq!(kind(&[0, 0, 0, 0, 9, 0, 1, 0]), ErrorKind::Protocol);
    // Get with a forged count far beyond the payload.
    let mut get = vec![12, 0, 0, 0, 0x05, 0, 0, 0];
    get.extend_from_slice(&(-1i64).to_le_bytes());
    get.extend_from_slice(&u32::MAX.to_le_bytes());
    get[0] = 12;
    assert_eq!(kind(&get), ErrorKind::Protocol);
    // Trailing garbage after a complete List.
    assert_eq!(kind(&[1, 0, 0, 0, 0x09, 0, 0, 0, 0]), ErrorKind::Protocol);
    // Bad boolean in Seal.
    assert_eq!(
        kind(&[6, 0, 0, 0, 0x03, 0, 0, 0, 2, 0xFF, 0, 0, 0, 0]),
        ErrorKind::Protocol
    );
    // Unknown durability in Seal and in WaitDurable.
    assert_eq!(
        kind(&[6, 0, 0, 0, 0x03, 0, 0, 0, 1, 7, 0, 0, 0, 0]),
        ErrorKind::Protocol
    );
    let mut wait = vec![13, 0, 0, 0, 0x0F, 0, 0, 0, 3];
    wait.extend_from_slice(&0i64.to_le_bytes());
    wait.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(kind(&wait), ErrorKind::Protocol);
}

/// A trace time past what the wire's i64 of µs holds saturates (no trace
/// point is later either way) instead of wrapping into -1 ("no trace"), a
/// negative time the daemon refuses, or an earlier time; a negative time
/// other than -1 on the wire is a protocol error.
#[test]
fn capacity_trace_times_saturate_and_malformed_ones_are_refused() {
    use std::time::Duration;
    let decoded = |since: Duration| {
        let mut buf = Vec::new();
        Request::Capacity {
            trace_since: Some(since),
        }
        .encode(&mut buf);
        match decode_request(&buf).unwrap().unwrap().0 {
            Request::Capacity { trace_since } => trace_since,
            other => panic!("decoded {other:?}"),
        }
    };
    let most = Duration::from_micros(i64::MAX as u64);
    assert_eq!(decoded(most), Some(most));
    let micros = |n: u128| Duration::new((n / 1_000_000) as u64, (n % 1_000_000) as u32 * 1000);
    for over in [
        1u128 << 63,
        (1 << 64) - 1,    // wrapped to -1
        (1 << 64) + 1500, // wrapped to 1.5 ms
        Duration::MAX.as_micros(),
    ] {
        assert_eq!(decoded(micros(over)), Some(most), "{over} µs");
    }
    for bad in [-2i64, i64::MIN] {
        let mut frame = vec![8, 0, 0, 0, 0x18, 0, 0, 0];
        frame.extend_from_slice(&bad.to_le_bytes());
        let err = decode_request(&frame).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol, "{bad}");
        assert!(err.message().contains("trace time"), "{err}");
    }
}

#[test]
fn an_objects_entry_with_an_unknown_state_is_a_typed_error() {
    let mut buf = Vec::new();
    Reply::Objects {
        objects: vec![Some(Located::local(
            1,
            ObjectLocation {
                offset: 128,
                data_size: 10,
                meta_size: 0,
            },
        ))],
    }
    .encode(&mut buf);
    let header = FrameHeader::parse(&buf).unwrap().unwrap();
    // The entry's state byte follows the count: 0 absent, 1 found, 2 found
    // and to be invalidated; anything else is refused.
    let state = FRAME_HEADER_LEN + 4;
    for (byte, invalidate) in [(1, false), (2, true)] {
        buf[state] = byte;
        match Reply::decode(header, &buf[FRAME_HEADER_LEN..]).unwrap() {
            Reply::Objects { objects } => assert_eq!(objects[0].unwrap().invalidate, invalidate),
            other => panic!("decoded {other:?}"),
        }
    }
    for byte in [3, 0x80, 0xff] {
        buf[state] = byte;
        let err = Reply::decode(header, &buf[FRAME_HEADER_LEN..]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol, "state byte {byte}");
    }
}

proptest! {
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_request(&bytes);
        if let Ok(Some(header)) = FrameHeader::parse(&bytes) {
            let end = (FRAME_HEADER_LEN + header.len as usize).min(bytes.len());
            let _ = Reply::decode(header, &bytes[FRAME_HEADER_LEN..end]);
        }
    }

    #[test]
    fn get_requests_round_trip(n in 0usize..50, timeout in any::<i64>()) {
        let ids: Vec<_> = (0..n).map(|_| ObjectId::random()).collect();
        round_trip_request(Request::Get { timeout_ms: timeout, ids });
    }
}
