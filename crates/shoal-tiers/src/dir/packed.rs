//! The tier's side of packed images (segments.rs has their layout and
//! state): staging and installing a batch's segment, reads, verifies and
//! deletes of packed images, marking copies dead, and giving space back
//! (removing emptied segments, compacting thinned ones).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;
use tracing::{info, warn};

use crate::format::{check_destination, checksum_mismatch, ObjectHeader, HEADER_LEN};
use crate::tier::PutItem;

use super::direct::{read_range_direct, reopen_direct, PACKED_DIRECT_MIN, RANGE_DIRECT_MAX};
use super::io::{copy_checksummed, in_parallel, io_error, sync_dir, READ_SLICE};
use super::segments::{
    check_header, copy_segment, read_header, read_payload, write_segment, Segment, Slot,
    StagedSegment, State, Tidy,
};
use super::tier::Inner;

impl Inner {
    /// A file image of `id` is in place: a packed copy of it (written by a
    /// build with another threshold) is replaced, i.e. marked dead.
    pub(super) fn drop_packed_copy(&self, id: &ObjectId) -> Result<()> {
        if self.delete_packed(id)?.is_some() {
            // `delete_packed` counted the object gone; the file image is it.
            self.changed(*id, true);
            self.objects.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Writes a segment of `items` under its final name, checksumming as it
    /// goes, and starts its write-back; nothing of it counts until it is
    /// published. Items whose capacity is refused or whose source is the
    /// wrong length fail alone; an I/O error fails them all. Outcomes per
    /// item: `None` for the ones in the segment.
    pub(super) fn stage_segment(
        &self,
        items: Vec<PutItem>,
    ) -> (Vec<Option<ShoalError>>, Option<StagedSegment>) {
        let mut outcomes: Vec<Option<ShoalError>> = Vec::with_capacity(items.len());
        let mut kept = Vec::with_capacity(items.len());
        let mut reserved = 0u64;
        for item in items {
            let stored = item.sizes.stored_len();
            let refused = if item.src.len() as u64 != item.sizes.payload_len() {
                Some(ShoalError::invalid(format!(
                    "object {}: source range of {} bytes for {} + {} bytes",
                    item.id,
                    item.src.len(),
                    item.sizes.data_size,
                    item.sizes.meta_size
                )))
            } else {
                self.reserve(stored).err()
            };
            if refused.is_none() {
                reserved += stored;
                kept.push(item);
            }
            outcomes.push(refused);
        }
        if kept.is_empty() {
            return (outcomes, None);
        }
        let fail_all = |outcomes: &mut Vec<Option<ShoalError>>, err: ShoalError| {
            for slot in outcomes.iter_mut().filter(|o| o.is_none()) {
                *slot = Some(err.clone());
            }
        };
        let seq = self.segments.take_seq();
        let path = self.segments.path(seq, "seg");
        match write_segment(&path, &kept) {
            Ok((file, images)) => {
                drop(kept); // the caller may reuse the sources' memory from here on
                let staged = StagedSegment {
                    seq,
                    file,
                    len: reserved,
                    images: images
                        .into_iter()
                        .map(|(header, slot)| (header, Slot { seq, ..slot }))
                        .collect(),
                };
                debug_assert_eq!(
                    staged.len,
                    staged.images.iter().map(|(_, s)| s.stored).sum::<u64>()
                );
                (outcomes, Some(staged))
            }
            Err(err) => {
                let _ = fs::remove_file(&path);
                self.unreserve(reserved);
                fail_all(&mut outcomes, err);
                (outcomes, None)
            }
        }
    }

    /// Makes a staged segment count, after its file and the segments
    /// directory were synced (`synced` says how that went): its images go
    /// into the index, and copies they replace are marked dead. Outcomes in
    /// the segment's order.
    pub(super) fn install_segment(
        &self,
        staged: StagedSegment,
        synced: Result<()>,
    ) -> Vec<Result<ObjectHeader>> {
        let n = staged.images.len();
        if let Err(err) = synced {
            let _ = fs::remove_file(self.segments.path(staged.seq, "seg"));
            self.unreserve(staged.len);
            return vec![Err(err); n];
        }
        let mut replaced: BTreeMap<u64, Vec<(ObjectId, Slot)>> = BTreeMap::new();
        let mut files = Vec::new();
        {
            let mut state = self.segments.lock();
            // Replacing an image of a segment being compacted waits for it.
            while staged.images.iter().any(|(h, _)| {
                state
                    .index
                    .get(&h.id)
                    .and_then(|old| state.segments.get(&old.seq))
                    .is_some_and(|seg| seg.compacting)
            }) {
                state = self
                    .segments
                    .settled
                    .wait(state)
                    .unwrap_or_else(|e| e.into_inner());
            }
            state.segments.insert(
                staged.seq,
                Segment {
                    file: Arc::new(staged.file),
                    len: staged.len,
                    members: staged.images.iter().map(|(h, _)| h.id).collect(),
                    images: n as u64,
                    live: staged.images.iter().map(|(_, s)| s.stored).sum(),
                    busy: 0,
                    unburied: 0,
                    compacting: false,
                    dead: None,
                },
            );
            for (header, slot) in &staged.images {
                match state.index.insert(header.id, *slot) {
                    Some(old) => {
                        if let Some(seg) = state.segments.get_mut(&old.seq) {
                            if !replaced.contains_key(&old.seq) {
                                seg.busy += 1;
                            }
                            replaced.entry(old.seq).or_default().push((header.id, old));
                        }
                    }
                    None => {
                        self.objects.fetch_add(1, Ordering::Relaxed);
                        files.push(header.id);
                    }
                }
                self.changed(header.id, true);
            }
        }
        let mut failed: HashMap<ObjectId, ShoalError> = HashMap::new();
        for (seq, ids) in replaced {
            // A copy not marked dead stays live on disk: the put fails, and
            // `retire` keeps the copy for the id's next delete to bury.
            if let Err(err) = self.retire(seq, &ids, false) {
                for (id, _) in ids {
                    failed.insert(id, err.clone());
                }
            }
        }
        // A file image of the same id (written before packing, or by a
        // build with another threshold) is replaced too.
        for id in files {
            let path = self.path_of(&id);
            if let Ok(meta) = fs::metadata(&path) {
                let removed = fs::remove_file(&path)
                    .map_err(|e| io_error(&format!("remove {}", path.display()), e))
                    .and_then(|()| sync_dir(path.parent().expect("a parent")));
                match removed {
                    Ok(()) => {
                        self.unreserve(meta.len());
                        self.objects.fetch_sub(1, Ordering::Relaxed);
                    }
                    Err(err) => {
                        failed.insert(id, err);
                    }
                }
            }
        }
        staged
            .images
            .into_iter()
            .map(|(header, _)| match failed.remove(&header.id) {
                Some(err) => Err(err),
                None => Ok(header),
            })
            .collect()
    }

    /// Marks copies in segment `seq` dead durably (they are out of the index
    /// already, and the caller counted the segment `busy` once), then
    /// accounts for them: an emptied segment is removed, a thinned one
    /// compacted. If the mark fails the copies are still live on disk: with
    /// `reinstate` they go back into the index (a delete that failed), else
    /// (a newer copy replaced them) into `unburied`, for `bury_unburied`.
    fn retire(&self, seq: u64, ids: &[(ObjectId, Slot)], reinstate: bool) -> Result<()> {
        let file = {
            let mut state = self.segments.lock();
            self.segments.dead_file(&mut state, seq)
        };
        let names: Vec<ObjectId> = ids.iter().map(|(id, _)| *id).collect();
        let written = file.and_then(|file| self.segments.write_dead(seq, &file, &names));
        let mut state = self.segments.lock();
        let seg = state
            .segments
            .get_mut(&seq)
            .expect("a busy segment is kept");
        seg.busy -= 1;
        if let Err(err) = written {
            if reinstate {
                for (id, slot) in ids {
                    state.index.insert(*id, *slot);
                }
            } else {
                seg.unburied += ids.len() as u32;
                for (id, slot) in ids {
                    state.unburied.entry(*id).or_default().push(*slot);
                }
            }
            return Err(err);
        }
        seg.images -= ids.len() as u64;
        seg.live -= ids.iter().map(|(_, slot)| slot.stored).sum::<u64>();
        let next = self.after_change(&mut state, seq);
        drop(state);
        self.tidy(next);
        Ok(())
    }

    /// What a segment needs after its live images changed, with the state
    /// locked: nothing, removal (no live image), or compaction (live bytes
    /// under half its length, and nothing else in flight on it).
    fn after_change(&self, state: &mut State, seq: u64) -> Tidy {
        let Some(seg) = state.segments.get_mut(&seq) else {
            return Tidy::Nothing;
        };
        if seg.busy > 0 || seg.compacting || seg.unburied > 0 {
            return Tidy::Nothing;
        }
        if seg.images == 0 {
            let seg = state.segments.remove(&seq).expect("just found");
            return Tidy::Remove(seq, seg.len);
        }
        if seg.live * 2 < seg.len {
            seg.compacting = true;
            let live: Vec<(ObjectId, Slot)> = seg
                .members
                .iter()
                .filter_map(|id| {
                    state
                        .index
                        .get(id)
                        .filter(|slot| slot.seq == seq)
                        .map(|slot| (*id, *slot))
                })
                .collect();
            let file = state.segments[&seq].file.clone();
            return Tidy::Compact(seq, file, live);
        }
        Tidy::Nothing
    }

    fn tidy(&self, tidy: Tidy) {
        match tidy {
            Tidy::Nothing => {}
            Tidy::Remove(seq, len) => {
                if let Err(err) = self.remove_segment(seq) {
                    warn!("segment {seq:016x}: not removed: {err}");
                }
                self.unreserve(len);
            }
            Tidy::Compact(seq, file, live) => {
                if let Err(err) = self.compact(seq, &file, live) {
                    warn!("segment {seq:016x}: not compacted: {err}");
                    let mut state = self.segments.lock();
                    if let Some(seg) = state.segments.get_mut(&seq) {
                        seg.compacting = false;
                    }
                    drop(state);
                    self.segments.settled.notify_all();
                }
            }
        }
    }

    /// Removes a segment's files: `.seg` first, made durable, then `.dead`.
    fn remove_segment(&self, seq: u64) -> Result<()> {
        let seg = self.segments.path(seq, "seg");
        match fs::remove_file(&seg) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(io_error(&format!("remove {}", seg.display()), e))
            }
            _ => {}
        }
        sync_dir(self.segments.dir())?;
        let dead = self.segments.path(seq, "dead");
        match fs::remove_file(&dead) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(io_error(&format!("remove {}", dead.display()), e))
            }
            _ => Ok(()),
        }
    }

    /// Copies the live images of segment `seq` into a new segment, points
    /// the index at it and removes the old one. Deletes and replaces of
    /// those images wait meanwhile (`compacting`).
    fn compact(&self, seq: u64, old: &File, live: Vec<(ObjectId, Slot)>) -> Result<()> {
        // Not refused when the tier is full: a compaction is what gives room
        // back. It overshoots by less than half the old segment, briefly.
        let bytes: u64 = live.iter().map(|(_, s)| s.stored).sum();
        self.wait_counted();
        self.used.fetch_add(bytes, Ordering::AcqRel);
        let new = self.segments.take_seq();
        let path = self.segments.path(new, "seg");
        let written = copy_segment(old, &path, &live).and_then(|file| {
            let outcomes = in_parallel(&[0, 1], |which| match which {
                0 => file.sync_all(),
                _ => File::open(self.segments.dir()).and_then(|d| d.sync_all()),
            });
            outcomes
                .into_iter()
                .collect::<io::Result<Vec<()>>>()
                .map_err(|e| io_error(&format!("fsync {}", path.display()), e))
                .map(|_| file)
        });
        let file = match written {
            Ok(file) => file,
            Err(err) => {
                let _ = fs::remove_file(&path);
                self.unreserve(bytes);
                return Err(err);
            }
        };
        let old_len = {
            let mut state = self.segments.lock();
            let mut offset = 0;
            let mut members = Vec::with_capacity(live.len());
            let mut live_bytes = 0;
            for (id, slot) in &live {
                let moved = Slot {
                    seq: new,
                    offset,
                    stored: slot.stored,
                };
                let previous = state.index.insert(*id, moved);
                debug_assert_eq!(previous, Some(*slot), "compacted images do not change");
                offset += slot.stored;
                live_bytes += slot.stored;
                members.push(*id);
            }
            state.segments.insert(
                new,
                Segment {
                    file: Arc::new(file),
                    len: bytes,
                    members,
                    images: live.len() as u64,
                    live: live_bytes,
                    busy: 0,
                    unburied: 0,
                    compacting: false,
                    dead: None,
                },
            );
            state.segments.remove(&seq).map_or(0, |s| s.len)
        };
        self.segments.settled.notify_all();
        self.unreserve(old_len);
        info!(
            "segment {seq:016x}: {} live images ({} bytes) compacted into {new:016x}, {} bytes back",
            live.len(),
            bytes,
            old_len.saturating_sub(bytes)
        );
        self.remove_segment(seq)
    }

    /// Reads `id`'s packed image into `dst` (payload only), checking header
    /// and checksum. `Ok(None)`: not packed here.
    pub(super) fn get_packed(&self, id: &ObjectId, dst: &mut [u8]) -> Result<Option<ObjectHeader>> {
        let Some((file, slot, path)) = self.segments.find(id) else {
            return Ok(None);
        };
        let what = format!("{} at {}", path.display(), slot.offset);
        // A slot larger than any packed image (a damaged index) takes the
        // buffered path, whose header check reports it.
        if (PACKED_DIRECT_MIN..=RANGE_DIRECT_MAX as u64).contains(&slot.stored) {
            if let Some(direct) = reopen_direct(&file) {
                return get_packed_direct(&direct, slot, id, dst, &what).map(Some);
            }
        }
        let header = read_header(&file, slot, id, &what)?;
        check_destination(id, dst.len() as u64, header.payload_len())?;
        let mut crc = 0u32;
        let mut at = slot.offset + HEADER_LEN as u64;
        for chunk in dst.chunks_mut(READ_SLICE) {
            read_payload(&file, chunk, at, &what)?;
            crc = crc32c::crc32c_append(crc, chunk);
            at += chunk.len() as u64;
        }
        if crc != header.checksum {
            return Err(checksum_mismatch(&what, header.checksum, crc));
        }
        Ok(Some(header))
    }

    /// `get_packed` without keeping the payload.
    pub(super) fn verify_packed(&self, id: &ObjectId) -> Result<Option<ObjectHeader>> {
        let Some((_, slot, _)) = self.segments.find(id) else {
            return Ok(None);
        };
        let mut buf = vec![0u8; (slot.stored as usize).saturating_sub(HEADER_LEN)];
        self.get_packed(id, &mut buf)
    }

    /// Marks dead the older copies of `id` a put replaced but could not
    /// mark dead then (`retire`). Until they are, no delete of `id` may
    /// succeed: once the newer copy's segment is gone, nothing would outrank
    /// them at the next open, and the deleted object would be adopted again.
    fn bury_unburied(&self, id: &ObjectId) -> Result<()> {
        let slots = {
            let mut state = self.segments.lock();
            let Some(slots) = state.unburied.remove(id) else {
                return Ok(());
            };
            for slot in &slots {
                let seg = state
                    .segments
                    .get_mut(&slot.seq)
                    .expect("a segment with unburied copies is kept");
                seg.unburied -= 1;
                seg.busy += 1;
            }
            slots
        };
        let mut outcome = Ok(());
        for slot in slots {
            // A failure puts the copy back into `unburied`.
            if let Err(err) = self.retire(slot.seq, &[(*id, slot)], false) {
                outcome = Err(err);
            }
        }
        outcome
    }

    /// Deletes `id`'s packed image durably. `Ok(None)`: not packed here;
    /// else the bytes of the image.
    pub(super) fn delete_packed(&self, id: &ObjectId) -> Result<Option<u64>> {
        self.bury_unburied(id)?;
        let slot = {
            let mut state = self.segments.lock();
            loop {
                let Some(slot) = state.index.get(id).copied() else {
                    return Ok(None);
                };
                if state.segments.get(&slot.seq).is_some_and(|s| s.compacting) {
                    state = self
                        .segments
                        .settled
                        .wait(state)
                        .unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                state.index.remove(id);
                state
                    .segments
                    .get_mut(&slot.seq)
                    .expect("indexed segments exist")
                    .busy += 1;
                break slot;
            }
        };
        // On failure the image is still live on disk: it stays served, so a
        // retried delete finds it again.
        self.retire(slot.seq, &[(*id, slot)], true)?;
        self.changed(*id, false);
        self.objects.fetch_sub(1, Ordering::Relaxed);
        Ok(Some(slot.stored))
    }

    /// Marks the copies a newer one superseded dead (the sweep at open).
    pub(super) fn bury_superseded(&self, superseded: Vec<(u64, ObjectId)>) -> Result<u64> {
        let mut by_seg: BTreeMap<u64, Vec<ObjectId>> = BTreeMap::new();
        for (seq, id) in superseded {
            by_seg.entry(seq).or_default().push(id);
        }
        let mut n = 0;
        for (seq, ids) in by_seg {
            let file = {
                let mut state = self.segments.lock();
                if !state.segments.contains_key(&seq) {
                    continue;
                }
                self.segments.dead_file(&mut state, seq)?
            };
            self.segments.write_dead(seq, &file, &ids)?;
            n += ids.len() as u64;
            let next = {
                let mut state = self.segments.lock();
                self.after_change(&mut state, seq)
            };
            self.tidy(next);
        }
        Ok(n)
    }
}

/// `get_packed` of an image read whole with one direct read from `direct`
/// (the segment opened with O_DIRECT): header checked, payload copied into
/// `dst` and checksummed.
fn get_packed_direct(
    direct: &File,
    slot: Slot,
    id: &ObjectId,
    dst: &mut [u8],
    what: &str,
) -> Result<ObjectHeader> {
    let read = read_range_direct(direct, slot.offset, slot.stored as usize, |image| {
        let header = check_header(image, slot, id, what)?;
        check_destination(id, dst.len() as u64, header.payload_len())?;
        let crc = copy_checksummed(dst, &image[HEADER_LEN..], 0);
        if crc != header.checksum {
            return Err(checksum_mismatch(what, header.checksum, crc));
        }
        Ok(header)
    });
    match read {
        Ok(checked) => checked,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(ShoalError::new(
            ErrorKind::ObjectCorrupt,
            format!("{what}: truncated image"),
        )),
        Err(e) => Err(io_error(&format!("read {what}"), e)),
    }
}
