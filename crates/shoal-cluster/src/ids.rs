//! Ids travel packed (n × 20 bytes in one `bytes` field): one allocation per
//! batch instead of one per id, and a length check rejects forged counts.

use shoal_core::ObjectId;
use tonic::Status;

/// Most ids one peer call may carry (2 M ids = 40 MB, under tonic's limits).
pub const MAX_IDS: usize = 2 << 20;

pub fn pack(ids: &[ObjectId]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * 20);
    for id in ids {
        out.extend_from_slice(&id.0);
    }
    out
}

pub fn unpack(bytes: &[u8]) -> Result<Vec<ObjectId>, Status> {
    if !bytes.len().is_multiple_of(20) {
        return Err(Status::invalid_argument(format!(
            "ids field of {} bytes is not a whole number of 20-byte ids",
            bytes.len()
        )));
    }
    if bytes.len() / 20 > MAX_IDS {
        return Err(Status::invalid_argument("too many ids in one call"));
    }
    Ok(bytes
        .chunks_exact(20)
        .map(|c| ObjectId(c.try_into().expect("20-byte chunk")))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_forged_lengths() {
        let ids = vec![ObjectId([1; 20]), ObjectId([2; 20])];
        assert_eq!(unpack(&pack(&ids)).unwrap(), ids);
        assert!(unpack(&[0; 39]).is_err());
        assert!(unpack(&[]).unwrap().is_empty());
    }
}
