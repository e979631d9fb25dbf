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

/// Bytes of one `AcquireReply` record.
pub const LOCATION_RECORD: usize = 21;

/// Appends one AcquireReply record: found flag and location.
pub fn push_location(out: &mut Vec<u8>, found: Option<shoal_core::location::ObjectLocation>) {
    let l = found.unwrap_or(shoal_core::location::ObjectLocation {
        offset: 0,
        data_size: 0,
        meta_size: 0,
    });
    out.push(u8::from(found.is_some()));
    out.extend_from_slice(&l.offset.to_le_bytes());
    out.extend_from_slice(&l.data_size.to_le_bytes());
    out.extend_from_slice(&l.meta_size.to_le_bytes());
}

/// Decodes AcquireReply records; `expected` is the request's id count.
pub fn locations(
    bytes: &[u8],
    expected: usize,
) -> Result<Vec<Option<shoal_core::location::ObjectLocation>>, Status> {
    if bytes.len() != expected * LOCATION_RECORD {
        return Err(Status::invalid_argument(format!(
            "{} bytes of locations for {expected} ids",
            bytes.len()
        )));
    }
    bytes
        .chunks_exact(LOCATION_RECORD)
        .map(|r| {
            let u64_at = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().expect("8 bytes"));
            let location = shoal_core::location::ObjectLocation {
                offset: u64_at(1),
                data_size: u64_at(9),
                meta_size: u32::from_le_bytes(r[17..21].try_into().expect("4 bytes")),
            };
            match r[0] {
                0 => Ok(None),
                1 => Ok(Some(location)),
                other => Err(Status::invalid_argument(format!("found flag {other}"))),
            }
        })
        .collect()
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

    #[test]
    fn location_records_round_trip_and_reject_forgeries() {
        let l = shoal_core::location::ObjectLocation {
            offset: 1 << 40,
            data_size: 12345,
            meta_size: 7,
        };
        let mut out = Vec::new();
        push_location(&mut out, Some(l));
        push_location(&mut out, None);
        assert_eq!(locations(&out, 2).unwrap(), vec![Some(l), None]);
        assert!(locations(&out, 3).is_err());
        out[0] = 2;
        assert!(locations(&out, 2).is_err());
    }
}
