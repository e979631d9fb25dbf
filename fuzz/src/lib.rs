//! The body of the `frame_decoder` fuzz target, shared by libFuzzer
//! (`fuzz_targets/frame_decoder.rs`, nightly) and the stable smoke test
//! (`tests/smoke.rs`), so CI runs the same checks without nightly.
//!
//! What is checked, for any input:
//! - `decode_request` consumes a stream of request frames until it asks for
//!   more bytes or fails; it never panics, a failure is always a
//!   `Protocol` error, and "need more bytes" is only answered when the header
//!   or the payload really is incomplete;
//! - every request that decodes re-encodes to exactly the bytes it came from
//!   (request encoding is canonical) and decodes again to the same value;
//! - every complete frame is also offered to `Reply::decode` (and to
//!   `Request::decode`, so frames after the first bad one are still
//!   exercised); a reply that decodes survives encode → decode unchanged.

use shoal_core::error::ErrorKind;
use shoal_core::event::ObjectEvent;
use shoal_core::ids::ObjectId;
use shoal_core::location::ObjectLocation;
use shoal_core::protocol::{
    decode_request, CreateSpec, FrameHeader, Located, NameEntry, PeerRegion, Reply, Request,
    FRAME_HEADER_LEN, MAX_FRAME_LEN, PROTOCOL_VERSION, WAIT_FOREVER,
};
use shoal_core::protocol::{ObjectInfo, StoreStats};

/// What one input exercised (for the smoke test's coverage assertions).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Requests decoded (by the stream decoder or frame by frame).
    pub requests: usize,
    /// Replies decoded.
    pub replies: usize,
    /// Complete frames or headers rejected with a protocol error.
    pub rejected: usize,
}

/// The fuzz target body: never panics on any input unless a decoder
/// invariant is broken.
pub fn fuzz_frames(data: &[u8]) {
    fuzz_frames_counted(data);
}

/// [`fuzz_frames`], also reporting what the input reached.
pub fn fuzz_frames_counted(data: &[u8]) -> Counts {
    let mut counts = Counts::default();
    request_stream(data, &mut counts);
    frame_by_frame(data, &mut counts);
    counts
}

/// Consumes request frames the way the daemon's connection reader does.
fn request_stream(data: &[u8], counts: &mut Counts) {
    let mut rest = data;
    loop {
        match decode_request(rest) {
            Ok(Some((request, used))) => {
                assert!(
                    (FRAME_HEADER_LEN..=rest.len()).contains(&used),
                    "decode_request used {used} of {} bytes",
                    rest.len()
                );
                check_request(&request, &rest[..used]);
                counts.requests += 1;
                rest = &rest[used..];
            }
            Ok(None) => {
                // "More bytes needed" must be true: a short header, or a
                // valid header whose payload has not fully arrived.
                match FrameHeader::parse(rest) {
                    Ok(None) => assert!(rest.len() < FRAME_HEADER_LEN),
                    Ok(Some(header)) => {
                        assert!(rest.len() < FRAME_HEADER_LEN + header.len as usize)
                    }
                    Err(err) => {
                        panic!("decode_request asked for more bytes on a bad header: {err}")
                    }
                }
                return;
            }
            Err(err) => {
                assert_eq!(err.kind(), ErrorKind::Protocol, "decoder failed with {err}");
                counts.rejected += 1;
                return;
            }
        }
    }
}

/// Walks the input frame by frame (headers only), offering every complete
/// payload to both decoders.
fn frame_by_frame(data: &[u8], counts: &mut Counts) {
    let mut rest = data;
    loop {
        let header = match FrameHeader::parse(rest) {
            Ok(Some(header)) => header,
            Ok(None) => return,
            Err(err) => {
                assert_eq!(
                    err.kind(),
                    ErrorKind::Protocol,
                    "header parse failed with {err}"
                );
                counts.rejected += 1;
                return;
            }
        };
        assert!(
            header.len <= MAX_FRAME_LEN,
            "accepted a {}-byte frame",
            header.len
        );
        let end = FRAME_HEADER_LEN + header.len as usize;
        let Some(payload) = rest.get(FRAME_HEADER_LEN..end) else {
            // Incomplete frame: the decoders must still cope with the short
            // payload (the result does not matter, only that nothing panics).
            let short = &rest[FRAME_HEADER_LEN..];
            let _ = Reply::decode(header, short);
            let _ = Request::decode(header, short);
            return;
        };
        match Request::decode(header, payload) {
            Ok(request) => {
                check_request(&request, &rest[..end]);
                counts.requests += 1;
            }
            Err(err) => assert_eq!(
                err.kind(),
                ErrorKind::Protocol,
                "request decode failed with {err}"
            ),
        }
        match Reply::decode(header, payload) {
            Ok(reply) => {
                check_reply(&reply);
                counts.replies += 1;
            }
            Err(err) => {
                assert_eq!(
                    err.kind(),
                    ErrorKind::Protocol,
                    "reply decode failed with {err}"
                );
                counts.rejected += 1;
            }
        }
        rest = &rest[end..];
    }
}

/// A decoded request re-encodes to the very bytes it came from and decodes
/// back to itself.
fn check_request(request: &Request, frame: &[u8]) {
    let mut encoded = Vec::with_capacity(frame.len());
    request.encode(&mut encoded);
    assert_eq!(encoded, frame, "re-encoding {request:?} changed its bytes");
    match decode_request(&encoded) {
        Ok(Some((again, used))) => {
            assert_eq!(&again, request, "request did not survive encode → decode");
            assert_eq!(used, encoded.len());
        }
        other => panic!("re-encoded {request:?} does not decode: {other:?}"),
    }
    assert_eq!(
        request.expects_reply(),
        !matches!(request, Request::Release { .. })
    );
}

/// A decoded reply survives encode → decode unchanged. (Reply decoding is not
/// byte-canonical: the location of a not-found `Objects` entry, the sizes of
/// a `Removed` notification and an unknown `Stats` policy name are
/// normalised, so only the value is compared.)
fn check_reply(reply: &Reply) {
    let mut encoded = Vec::new();
    reply.encode(&mut encoded);
    let header = match FrameHeader::parse(&encoded) {
        Ok(Some(header)) => header,
        other => panic!("re-encoded reply {reply:?} has a bad header: {other:?}"),
    };
    assert_eq!(header.len as usize, encoded.len() - FRAME_HEADER_LEN);
    match Reply::decode(header, &encoded[FRAME_HEADER_LEN..]) {
        Ok(again) => assert_eq!(&again, reply, "reply did not survive encode → decode"),
        Err(err) => panic!("re-encoded reply {reply:?} does not decode: {err}"),
    }
}

fn id(n: u8) -> ObjectId {
    let mut bytes = [0u8; 20];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = n.wrapping_mul(31).wrapping_add(i as u8);
    }
    ObjectId(bytes)
}

/// One request of every kind, with a few edge values (no ids, several ids,
/// extreme sizes and timeouts). Used as a seed corpus and by the smoke test.
pub fn sample_requests() -> Vec<Request> {
    let ids: Vec<ObjectId> = (0..3).map(id).collect();
    vec![
        Request::Hello {
            version: PROTOCOL_VERSION,
            pid: 4242,
        },
        Request::Create {
            timeout_ms: 100,
            objects: vec![
                CreateSpec {
                    id: ids[0],
                    data_size: 1000,
                    meta_size: 16,
                },
                CreateSpec {
                    id: ids[1],
                    data_size: u64::MAX,
                    meta_size: u32::MAX,
                },
            ],
            growing: false,
        },
        Request::Create {
            timeout_ms: 0,
            objects: vec![],
            growing: true,
        },
        Request::Seal {
            release: true,
            durability: None,
            ids: ids.clone(),
        },
        Request::Seal {
            release: false,
            durability: Some(shoal_core::durability::Durability::Local),
            ids: vec![ids[2]],
        },
        Request::WaitDurable {
            level: shoal_core::durability::Durability::Backing,
            timeout_ms: 5,
            ids: ids.clone(),
        },
        Request::StageIn { ids: ids.clone() },
        Request::StageOut { ids: vec![ids[0]] },
        Request::Cool { ids: ids.clone() },
        Request::Tiers,
        Request::Name {
            id: ids[0],
            name: "runs/1/table.arrow".into(),
        },
        Request::Resolve { name: "a/b".into() },
        Request::ListNames { prefix: "".into() },
        Request::Rename {
            from: "a".into(),
            to: "b/c".into(),
        },
        Request::Unlink { name: "a/b".into() },
        Request::SetMtime {
            name: "a/b".into(),
            mtime_ms: 1,
        },
        Request::Abort { id: ids[1] },
        Request::Resize {
            id: ids[0],
            data_size: 1 << 20,
        },
        Request::Get {
            timeout_ms: WAIT_FOREVER,
            ids: ids.clone(),
        },
        Request::Get {
            timeout_ms: 0,
            ids: vec![],
        },
        Request::Get {
            timeout_ms: i64::MAX,
            ids: vec![ids[0]],
        },
        Request::Release {
            ids: vec![ids[0], ids[0]],
        },
        Request::Delete { ids: ids.clone() },
        Request::Contains { id: ids[2] },
        Request::List,
        Request::Stats,
        Request::Subscribe,
        Request::Evict { bytes: u64::MAX },
        Request::ClusterInfo,
    ]
}

/// One reply of every kind.
pub fn sample_replies() -> Vec<Reply> {
    let loc = ObjectLocation {
        offset: 4096,
        data_size: 1000,
        meta_size: 16,
    };
    vec![
        Reply::Ok,
        Reply::Error {
            kind: ErrorKind::StoreFull,
            message: "no room ✓".into(),
        },
        Reply::Welcome {
            version: PROTOCOL_VERSION,
            client_id: 7,
            region_size: 1 << 30,
            capacity: 1 << 29,
            line_size: 64,
            resident: true,
            clustered: false,
        },
        Reply::Created {
            generation: 0,
            offsets: vec![0, 64, 128],
        },
        Reply::Staged {
            offsets: vec![4096],
        },
        Reply::Objects {
            objects: vec![
                Some(Located {
                    node: 1,
                    generation: 0x0123_4567_89ab_cdef,
                    location: loc,
                    invalidate: false,
                }),
                None,
                Some(Located {
                    node: 0,
                    generation: 0,
                    location: loc,
                    invalidate: true,
                }),
            ],
        },
        Reply::ClusterInfo {
            node: 0,
            coherent: true,
            simulated: false,
            cluster: "name=demo token-sha256=00112233445566778899aabbccddeeff".into(),
            encryption: "tls1.3, data channel tls-userspace".into(),
            nodes: vec![PeerRegion {
                node: 1,
                mapped: true,
                alive: true,
                region_size: 1 << 20,
                path: "/dev/shm/x".into(),
            }],
        },
        Reply::Bool(true),
        Reply::Bool(false),
        Reply::List {
            objects: vec![ObjectInfo {
                id: id(1),
                location: loc,
                sealed: true,
                refs: 2,
                resident: true,
                tiers: 1,
            }],
        },
        Reply::Stats(StoreStats {
            capacity: 1 << 29,
            region_size: 1 << 30,
            used: 4096,
            policy: "lru",
            ..Default::default()
        }),
        Reply::Notification(ObjectEvent::Sealed {
            id: id(2),
            data_size: 5,
            meta_size: 1,
        }),
        Reply::Notification(ObjectEvent::Removed {
            id: id(2),
            deleted: false,
        }),
        Reply::Notification(ObjectEvent::Removed {
            id: id(3),
            deleted: true,
        }),
        Reply::Notification(ObjectEvent::Aborted { id: id(4) }),
        Reply::Statuses {
            errors: vec![
                None,
                Some(ErrorKind::ObjectNotFound),
                Some(ErrorKind::ObjectNotSealed),
            ],
        },
        Reply::Evicted { bytes: 64 },
        Reply::Named(NameEntry {
            name: "a/b".into(),
            id: id(7),
            data_size: 9,
            meta_size: 0,
            mtime_ms: 1,
        }),
        Reply::Names { entries: vec![] },
    ]
}

/// The encoded frames of [`sample_requests`] and [`sample_replies`].
pub fn sample_frames() -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for request in sample_requests() {
        let mut frame = Vec::new();
        request.encode(&mut frame);
        frames.push(frame);
    }
    for reply in sample_replies() {
        let mut frame = Vec::new();
        reply.encode(&mut frame);
        frames.push(frame);
    }
    frames
}
