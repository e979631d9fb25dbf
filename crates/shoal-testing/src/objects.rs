//! Objects whose bytes a test can tell apart, and reading one back whole.

use std::ops::Range;

use shoal_client::Client;
use shoal_core::ObjectId;

/// 1,000 bytes of a pattern that differs for every `seed`.
pub fn pattern(seed: u32) -> Vec<u8> {
    (0..1000u32)
        .map(|i| (i.wrapping_mul(31) ^ seed) as u8)
        .collect()
}

/// A copy of what `client` reads for `id` (released again); `None` if no
/// node has it. A failed get fails the test.
pub fn read_object(client: &mut Client, id: ObjectId) -> Option<Vec<u8>> {
    let located = client.get(&[id], 0).unwrap()[0]?;
    let ptr = client.located_ptr(located).unwrap();
    // SAFETY: referenced by the get; bounds checked on receipt.
    let bytes =
        unsafe { std::slice::from_raw_parts(ptr, located.location.data_size as usize) }.to_vec();
    client.release(&[id]).unwrap();
    Some(bytes)
}

/// Puts [`pattern`]`(seed)` under a fresh random id for every seed of
/// `seeds`, through `even` for even seeds and `odd` for odd ones (objects on
/// two nodes); returns each object's (id, seed).
pub fn put_patterns(
    even: &mut Client,
    odd: &mut Client,
    seeds: Range<u32>,
) -> Vec<(ObjectId, u32)> {
    seeds
        .map(|seed| {
            let id = ObjectId::random();
            let client = if seed % 2 == 0 { &mut *even } else { &mut *odd };
            client.put(id, &pattern(seed), b"").unwrap();
            (id, seed)
        })
        .collect()
}
