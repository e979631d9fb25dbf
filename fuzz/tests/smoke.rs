//! Stable-Rust smoke run of the fuzz target body: deterministic pseudo-random
//! inputs and mutations of valid frames, so CI exercises the decoder checks
//! without nightly or libFuzzer.

use shoal_core::protocol::{decode_request, Request, FRAME_HEADER_LEN};
use shoal_fuzz::{fuzz_frames, fuzz_frames_counted, sample_frames, sample_requests, Counts};

/// xorshift64*: tiny, deterministic, good enough to scatter bytes.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
}

fn add(total: &mut Counts, c: Counts) {
    total.requests += c.requests;
    total.replies += c.replies;
    total.rejected += c.rejected;
}

#[test]
fn random_byte_strings() {
    let mut rng = Rng::new(0x5eed_0001);
    for _ in 0..20_000 {
        let len = match rng.below(4) {
            0 => rng.below(FRAME_HEADER_LEN + 1),
            1 => rng.below(64),
            _ => rng.below(600),
        };
        let mut data = rng.bytes(len);
        // Half the time make the header plausible (small length, zero flags)
        // so inputs get past the header check into the payload decoders.
        if data.len() >= FRAME_HEADER_LEN && rng.below(2) == 0 {
            let payload = (data.len() - FRAME_HEADER_LEN) as u32;
            let claimed = if rng.below(4) == 0 {
                rng.next() as u32 % (payload + 8)
            } else {
                payload
            };
            data[0..4].copy_from_slice(&claimed.to_le_bytes());
            data[6] = 0;
            data[7] = 0;
            if rng.below(2) == 0 {
                // A known opcode: requests 0x01..=0x0C, replies 0x80..=0x8A.
                data[4] = if rng.below(2) == 0 {
                    1 + rng.below(12) as u8
                } else {
                    0x80 + rng.below(11) as u8
                };
                data[5] = 0;
            }
        }
        fuzz_frames(&data);
    }
}

#[test]
fn random_payloads_behind_valid_headers() {
    let mut rng = Rng::new(0x5eed_0002);
    let mut total = Counts::default();
    let opcodes: Vec<u16> = (0x00..=0x0D).chain(0x7F..=0x8B).chain([0xFFFF]).collect();
    for &opcode in &opcodes {
        for _ in 0..300 {
            let len = match rng.below(3) {
                0 => rng.below(4),
                1 => rng.below(48),
                _ => rng.below(256),
            };
            let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + len);
            frame.extend_from_slice(&(len as u32).to_le_bytes());
            frame.extend_from_slice(&opcode.to_le_bytes());
            frame.extend_from_slice(&[0, 0]);
            let payload = rng.bytes(len);
            frame.extend(payload);
            add(&mut total, fuzz_frames_counted(&frame));
        }
    }
    // Empty-payload requests and replies (List, Stats, Subscribe, Ok) and
    // fixed-size ones decode from random bytes often enough to be reached.
    eprintln!("{total:?}");
    assert!(
        total.requests > 0 && total.replies > 0 && total.rejected > 0,
        "{total:?}"
    );
}

/// Mutations a byte-level fuzzer would try first.
fn mutate(rng: &mut Rng, frame: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut m = frame.to_vec();
    let rounds = 1 + rng.below(3);
    for _ in 0..rounds {
        match rng.below(9) {
            // Flip one bit.
            0 if !m.is_empty() => {
                let i = rng.below(m.len());
                m[i] ^= 1 << rng.below(8);
            }
            // Set a byte to an interesting value.
            1 if !m.is_empty() => {
                let i = rng.below(m.len());
                m[i] = [0x00, 0x01, 0x02, 0x7f, 0x80, 0xfe, 0xff][rng.below(7)];
            }
            // Truncate.
            2 => {
                let cut = rng.below(m.len() + 1);
                m.truncate(cut);
            }
            // Append junk.
            3 => {
                let n = 1 + rng.below(40);
                m.extend(rng.bytes(n));
            }
            // Forge the length field (off by a little, or anything).
            4 if m.len() >= 4 => {
                let len = u32::from_le_bytes(m[0..4].try_into().unwrap());
                let forged = match rng.below(3) {
                    0 => len.wrapping_add(1),
                    1 => len.wrapping_sub(1),
                    _ => rng.next() as u32,
                };
                m[0..4].copy_from_slice(&forged.to_le_bytes());
            }
            // Forge a u32 count somewhere in the payload.
            5 if m.len() >= FRAME_HEADER_LEN + 4 => {
                let at = FRAME_HEADER_LEN + rng.below(m.len() - FRAME_HEADER_LEN - 3);
                let count = [u32::MAX, u32::MAX / 20, 1 << 24, 2, 0][rng.below(5)];
                m[at..at + 4].copy_from_slice(&count.to_le_bytes());
            }
            // Insert or delete a byte in the middle.
            6 if !m.is_empty() => {
                let i = rng.below(m.len());
                if rng.below(2) == 0 {
                    m.insert(i, rng.byte());
                } else {
                    m.remove(i);
                }
            }
            // Splice another valid frame after (or instead of the tail of) this one.
            7 => {
                let other = &others[rng.below(others.len())];
                let cut = rng.below(m.len() + 1);
                m.truncate(cut);
                m.extend_from_slice(other);
            }
            // Change the opcode.
            _ if m.len() >= 6 => {
                m[4] = rng.byte();
                if rng.below(4) == 0 {
                    m[5] = rng.byte();
                }
            }
            _ => {}
        }
    }
    m
}

#[test]
fn mutated_valid_frames() {
    let frames = sample_frames();
    let mut total = Counts::default();
    // Unmutated frames decode (as a request or a reply) and pass every check.
    for frame in &frames {
        let c = fuzz_frames_counted(frame);
        assert!(
            c.requests + c.replies == 2 || c.requests + c.replies == 1,
            "{c:?} for {frame:02x?}"
        );
    }
    let mut rng = Rng::new(0x5eed_0003);
    for frame in &frames {
        for _ in 0..1_000 {
            let data = mutate(&mut rng, frame, &frames);
            add(&mut total, fuzz_frames_counted(&data));
        }
    }
    eprintln!("{total:?}");
    assert!(
        total.requests > 0 && total.replies > 0 && total.rejected > 0,
        "{total:?}"
    );
}

#[test]
fn valid_request_stream_decodes_in_order() {
    let requests = sample_requests();
    let mut stream = Vec::new();
    for request in &requests {
        request.encode(&mut stream);
    }
    let mut decoded: Vec<Request> = Vec::new();
    let mut rest = &stream[..];
    while let Some((request, used)) = decode_request(rest).expect("valid stream") {
        decoded.push(request);
        rest = &rest[used..];
    }
    assert!(rest.is_empty());
    assert_eq!(decoded, requests);
    let c = fuzz_frames_counted(&stream);
    // Each request is counted by the stream decoder and again frame by frame.
    assert_eq!(c.requests, 2 * requests.len());
    // Every strict prefix of the stream is handled too.
    for cut in 0..stream.len() {
        fuzz_frames(&stream[..cut]);
    }
}
