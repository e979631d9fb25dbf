//! Small objects packed into segment files.
//!
//! Why: one file per object costs a create, a rename and a share of a
//! journal commit each; at 64 KiB that held a spill to ~0.6× the disk's
//! sequential write limit. A segment holds a batch's small images back to
//! back and is made durable with one fsync, so small objects spill as one
//! sequential write.
//!
//! ```text
//! <root>/segments/<seq>.seg    images, back to back from offset 0, then an
//!                              index and a trailer; written once, never changed
//! <root>/segments/<seq>.dead   that segment's images deleted since (appended)
//! ```
//! `<seq>` is 16 hex digits, increasing: a higher one was written later.
//!
//! Segment layout (integers little-endian):
//! ```text
//! images   each: 64-byte header (format.rs) + payload
//! index    per image 40 bytes: id (20) | offset u64 | stored u64 | payload crc32c u32
//! trailer  32 bytes: magic "SHOALSEG" | version u32 | images u32 | index offset u64
//!          | crc32c of the index u32 | crc32c of trailer bytes 0..28 u32
//! ```
//! A dead record is 24 bytes: id (20) | crc32c of the id (4).
//!
//! Rules (docs/tiers.md, "Segments"):
//! - A segment is written under its final name and published by one fsync
//!   of the file and of the directory (together); a put returns after both.
//!   At open its index says where its images are; a segment without a valid
//!   trailer (a crash while it was written) or with a damaged index is read
//!   by walking its images' headers instead. Images found that way that the
//!   manifest does not know are verified in full by recovery and adopted or
//!   removed, like files it has no record of; a segment holding none is
//!   removed.
//! - Which copy of an id counts: a file image (`objects/`) over any packed
//!   one; else the newest segment that holds the id decides, live or dead.
//!   Older live copies (a crash during a replace or a compaction) are marked
//!   dead when the tier is swept at open.
//! - A delete appends a dead record to the segment's `.dead` file and
//!   fdatasyncs it before it returns; a put that replaces an id marks the
//!   old copy dead the same way before it returns. If that mark fails, the
//!   put fails and the old copy is remembered (`State::unburied`): the id's
//!   next delete marks it dead first or fails, since once the newer segment
//!   is gone nothing on disk would outrank the old copy.
//! - Space comes back when a segment holds no live image (its file is
//!   removed) or when its live bytes fall under half its length: then the
//!   live images are copied into a new segment (compaction) and the old one
//!   removed. While a segment is compacted, deletes and replaces of its
//!   images wait, so the copy is exactly its live images.
//! - `.seg` is removed (and the directory synced) before `.dead`: a dead
//!   record never outlives the segment it kills.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::{ObjectId, ID_LEN};
use tracing::{info, warn};

use crate::format::{ObjectHeader, HEADER_LEN};
use crate::tier::PutItem;

use super::io::{io_error, CHUNK};

pub(super) const SEGMENTS: &str = "segments";

/// The sequence number and extension of a segment directory's file name, if
/// it is exactly one this tier writes (`{seq:016x}.{ext}`, lower-case):
/// `u64::from_str_radix` alone takes a sign and either case, so
/// `+000000000000001.seg` or `000000000000000A.seg` would be read as
/// segments 1 and 10.
fn segment_file(name: &str) -> Option<(u64, String)> {
    let (seq, ext) = name.split_once('.')?;
    let number = u64::from_str_radix(seq, 16).ok()?;
    (format!("{number:016x}") == seq).then(|| (number, ext.to_owned()))
}
/// Objects whose payload is at most this many bytes are packed.
pub(super) const PACK_MAX: u64 = 1 << 20;
/// Bytes of images per segment at most: a larger batch writes several,
/// staged from several threads at once and synced in one wave.
const SEGMENT_MAX: u64 = 8 << 20;
const MAGIC: [u8; 8] = *b"SHOALSEG";
const VERSION: u32 = 1;
const INDEX_ENTRY: usize = 40;
const TRAILER: usize = 32;
const DEAD_RECORD: usize = 24;

/// Where a packed image lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub seq: u64,
    /// Offset of the image (its header) in the segment.
    pub offset: u64,
    /// Bytes of the image, header included.
    pub stored: u64,
}

pub(super) struct Segment {
    pub(super) file: Arc<File>,
    /// Bytes of its images, live or dead: the capacity it takes (the index
    /// and trailer are bookkeeping, like a file's inode, and not counted).
    pub(super) len: u64,
    /// Every id written into it, live or not.
    pub(super) members: Vec<ObjectId>,
    /// Live images and their bytes.
    pub(super) images: u64,
    pub(super) live: u64,
    /// Deletes and replaces of its images in flight.
    pub(super) busy: u32,
    /// Its copies in `State::unburied`: while there are any, it is neither
    /// removed nor compacted, so their dead records can still be written.
    pub(super) unburied: u32,
    pub(super) compacting: bool,
    /// Its `.dead` file, once opened.
    pub(super) dead: Option<Arc<File>>,
}

/// The packed images of a tier: an index id → slot, and the segments.
pub(super) struct Segments {
    pub(super) dir: PathBuf,
    pub(super) state: Mutex<State>,
    /// Signalled when a compaction ends.
    pub(super) settled: Condvar,
    pub(super) next_seq: AtomicU64,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) index: HashMap<ObjectId, Slot>,
    pub(super) segments: BTreeMap<u64, Segment>,
    /// Older copies a put replaced whose dead records could not be written
    /// (an I/O error): still live on disk, out of the index. The id's next
    /// delete writes them first, or fails.
    pub(super) unburied: HashMap<ObjectId, Vec<Slot>>,
}

/// What a segment needs after its live images changed (packed.rs decides
/// it, with the state locked, and then does it).
pub(super) enum Tidy {
    Nothing,
    Remove(u64, u64),
    Compact(u64, Arc<File>, Vec<(ObjectId, Slot)>),
}

/// What loading the segments at open found.
#[derive(Default)]
pub(super) struct Loaded {
    /// Live packed ids.
    pub ids: Vec<ObjectId>,
    /// Bytes of the segment files kept, and their live images.
    pub bytes: u64,
    pub images: u64,
    /// Files to remove at the sweep: unfinished or emptied segments, `.dead`
    /// files without a segment, names that are neither.
    pub strays: Vec<PathBuf>,
    /// Live copies that a newer one supersedes: marked dead at the sweep.
    pub superseded: Vec<(u64, ObjectId)>,
}

/// A segment written and not yet published.
pub(super) struct StagedSegment {
    pub(super) seq: u64,
    pub(super) file: File,
    pub(super) len: u64,
    /// Per image: its header and where it is.
    pub(super) images: Vec<(ObjectHeader, Slot)>,
}

impl StagedSegment {
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Segments {
    pub fn new(root: &Path) -> Self {
        Self {
            dir: root.join(SEGMENTS),
            state: Mutex::new(State::default()),
            settled: Condvar::new(),
            next_seq: AtomicU64::new(0),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn path(&self, seq: u64, ext: &str) -> PathBuf {
        self.dir.join(format!("{seq:016x}.{ext}"))
    }

    /// Where `id`'s packed image is, with the segment to read it from.
    pub fn find(&self, id: &ObjectId) -> Option<(Arc<File>, Slot, PathBuf)> {
        let state = self.lock();
        let slot = *state.index.get(id)?;
        let file = state.segments.get(&slot.seq)?.file.clone();
        Some((file, slot, self.path(slot.seq, "seg")))
    }

    /// Ids of the live packed images.
    pub fn ids(&self) -> Vec<ObjectId> {
        self.lock().index.keys().copied().collect()
    }

    /// Reads every segment and dead file (at open, before any other use).
    pub fn load(&self) -> Result<Loaded> {
        let mut loaded = Loaded::default();
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(loaded),
            Err(e) => return Err(io_error(&format!("list {}", self.dir.display()), e)),
        };
        let (mut segs, mut deads) = (BTreeMap::new(), BTreeMap::new());
        let mut max_seq = None;
        for entry in entries {
            let entry = entry.map_err(|e| io_error(&format!("list {}", self.dir.display()), e))?;
            let name = entry.file_name();
            let parsed = name.to_str().and_then(segment_file);
            match parsed {
                Some((seq, ext)) if ext == "seg" || ext == "dead" => {
                    max_seq = max_seq.max(Some(seq));
                    if ext == "seg" {
                        segs.insert(seq, entry.path());
                    } else {
                        deads.insert(seq, entry.path());
                    }
                }
                _ => loaded.strays.push(entry.path()),
            }
        }
        self.next_seq
            .store(max_seq.map_or(0, |s| s + 1), Ordering::Release);
        let mut state = self.lock();
        for (seq, path) in segs {
            let Some((file, images)) = read_segment(&path)? else {
                loaded.strays.push(path);
                continue;
            };
            let dead = match deads.remove(&seq) {
                Some(dead_path) => read_dead(&dead_path)?,
                None => HashSet::new(),
            };
            let mut members = Vec::with_capacity(images.len());
            let len = images.iter().map(|(_, slot)| slot.stored).sum();
            for (id, slot) in images {
                members.push(id);
                let slot = Slot { seq, ..slot };
                // Segments come in increasing order: this copy is the newest.
                let older = if dead.contains(&id) {
                    state.index.remove(&id)
                } else {
                    state.index.insert(id, slot)
                };
                if let Some(older) = older {
                    loaded.superseded.push((older.seq, id));
                }
            }
            state.segments.insert(
                seq,
                Segment {
                    file: Arc::new(file),
                    len,
                    members,
                    images: 0,
                    live: 0,
                    busy: 0,
                    unburied: 0,
                    compacting: false,
                    dead: None,
                },
            );
        }
        // `.dead` files whose segment is gone.
        loaded.strays.extend(deads.into_values());
        let State {
            index, segments, ..
        } = &mut *state;
        for slot in index.values() {
            let seg = segments.get_mut(&slot.seq).expect("indexed segments exist");
            seg.images += 1;
            seg.live += slot.stored;
        }
        let empty: Vec<u64> = segments
            .iter()
            .filter(|(_, seg)| seg.images == 0)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in empty {
            segments.remove(&seq);
            loaded.strays.push(self.path(seq, "seg"));
            loaded.strays.push(self.path(seq, "dead"));
        }
        loaded
            .superseded
            .retain(|(seq, _)| segments.contains_key(seq));
        loaded.ids = index.keys().copied().collect();
        loaded.bytes = segments.values().map(|s| s.len).sum();
        loaded.images = index.len() as u64;
        Ok(loaded)
    }

    /// Forgets the packed copy of `id` because a file image of it exists
    /// (at open: a file image wins). Returns the copy to mark dead.
    pub fn supersede(&self, id: &ObjectId) -> Option<Slot> {
        let mut state = self.lock();
        let slot = state.index.remove(id)?;
        let seg = state.segments.get_mut(&slot.seq)?;
        seg.images -= 1;
        seg.live -= slot.stored;
        Some(slot)
    }

    pub(super) fn take_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::AcqRel)
    }

    /// Appends dead records for `ids` to segment `seq`'s `.dead` file and
    /// makes them durable. The segment must be kept (`busy`) by the caller.
    pub(super) fn write_dead(&self, seq: u64, file: &File, ids: &[ObjectId]) -> Result<()> {
        let mut records = Vec::with_capacity(ids.len() * DEAD_RECORD);
        for id in ids {
            records.extend_from_slice(id.as_bytes());
            records.extend_from_slice(&crc32c::crc32c(id.as_bytes()).to_le_bytes());
        }
        let what = || self.path(seq, "dead").display().to_string();
        // O_APPEND: concurrent appends of whole records do not interleave.
        let mut append: &File = file;
        io::Write::write_all(&mut append, &records)
            .and_then(|()| file.sync_data())
            .map_err(|e| io_error(&format!("write {}", what()), e))
    }

    /// The `.dead` file of segment `seq`, opened (and created durably) on
    /// first use. Called with the state locked: creating it is rare.
    pub(super) fn dead_file(&self, state: &mut State, seq: u64) -> Result<Arc<File>> {
        let seg = state
            .segments
            .get_mut(&seq)
            .expect("the caller holds the segment");
        if let Some(file) = &seg.dead {
            return Ok(file.clone());
        }
        let path = self.path(seq, "dead");
        let existed = path.exists();
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|e| io_error(&format!("open {}", path.display()), e))?;
        if !existed {
            super::io::sync_dir(&self.dir)?;
        }
        let file = Arc::new(file);
        seg.dead = Some(file.clone());
        Ok(file)
    }
}

/// A segment's images, or `None` if it holds none. Its index says where
/// they are; without a valid trailer (a crash while it was written) or over
/// a damaged index they are found by walking their headers: complete images
/// are kept for recovery to verify and adopt, like files it has no record of.
#[allow(clippy::type_complexity)]
pub(super) fn read_segment(path: &Path) -> Result<Option<(File, Vec<(ObjectId, Slot)>)>> {
    let what = path.display().to_string();
    let file = File::open(path).map_err(|e| io_error(&format!("open {what}"), e))?;
    let len = file
        .metadata()
        .map_err(|e| io_error(&format!("stat {what}"), e))?
        .len();
    let mut trailer = [0u8; TRAILER];
    let valid = len >= TRAILER as u64
        && file
            .read_exact_at(&mut trailer, len - TRAILER as u64)
            .is_ok()
        && trailer[0..8] == MAGIC
        && crc32c::crc32c(&trailer[..28]) == le32(&trailer[28..32]);
    let images = if valid {
        let version = le32(&trailer[8..12]);
        if version != VERSION {
            return Err(ShoalError::new(
                ErrorKind::VersionMismatch,
                format!("{what}: segment format version {version}, this build reads {VERSION}"),
            ));
        }
        let indexed = read_index(&file, len, &trailer, &what)?;
        if indexed.is_none() {
            warn!("{what}: damaged segment index; finding the images by their headers");
        }
        indexed
    } else {
        None
    };
    let images = match images {
        Some(images) => images,
        None => {
            let end = if valid { len - TRAILER as u64 } else { len };
            let found = walk_headers(&file, end, &what)?;
            if !valid {
                info!(
                    "{what}: unfinished segment (no trailer): {} complete images in it",
                    found.len()
                );
            }
            found
        }
    };
    Ok((!images.is_empty()).then_some((file, images)))
}

/// The images a valid trailer's index lists, or `None` if the index is
/// damaged.
pub(super) fn read_index(
    file: &File,
    len: u64,
    trailer: &[u8; TRAILER],
    what: &str,
) -> Result<Option<Vec<(ObjectId, Slot)>>> {
    let count = u64::from(le32(&trailer[12..16]));
    let index_at = le64(&trailer[16..24]);
    let index_len = count * INDEX_ENTRY as u64;
    if index_at.checked_add(index_len) != Some(len - TRAILER as u64) {
        return Ok(None);
    }
    let mut index = vec![0u8; index_len as usize];
    file.read_exact_at(&mut index, index_at)
        .map_err(|e| io_error(&format!("read {what}"), e))?;
    if crc32c::crc32c(&index) != le32(&trailer[24..28]) {
        return Ok(None);
    }
    Ok(Some(
        index
            .chunks_exact(INDEX_ENTRY)
            .map(|e| {
                let id = ObjectId::from_slice(&e[..ID_LEN]).expect("20 bytes");
                let slot = Slot {
                    seq: 0,
                    offset: le64(&e[20..28]),
                    stored: le64(&e[28..36]),
                };
                (id, slot)
            })
            .filter(|(_, slot)| {
                slot.offset
                    .checked_add(slot.stored)
                    .is_some_and(|end| end <= index_at)
            })
            .collect(),
    ))
}

/// The images of a segment found by reading header after header from the
/// start, until one does not check out.
pub(super) fn walk_headers(file: &File, end: u64, what: &str) -> Result<Vec<(ObjectId, Slot)>> {
    let mut out = Vec::new();
    let mut offset = 0u64;
    let mut head = [0u8; HEADER_LEN];
    while offset + HEADER_LEN as u64 <= end {
        if file.read_exact_at(&mut head, offset).is_err() {
            break;
        }
        let Ok(header) = ObjectHeader::decode(&head, what) else {
            break;
        };
        let stored = header.stored_len();
        if offset.checked_add(stored).is_none_or(|e| e > end) {
            break;
        }
        out.push((
            header.id,
            Slot {
                seq: 0,
                offset,
                stored,
            },
        ));
        offset += stored;
    }
    Ok(out)
}

/// The ids a `.dead` file names (a torn last record is ignored: its delete
/// had not returned).
pub(super) fn read_dead(path: &Path) -> Result<HashSet<ObjectId>> {
    let bytes = fs::read(path).map_err(|e| io_error(&format!("read {}", path.display()), e))?;
    Ok(bytes
        .chunks_exact(DEAD_RECORD)
        .filter(|r| crc32c::crc32c(&r[..ID_LEN]) == le32(&r[ID_LEN..]))
        .map(|r| ObjectId::from_slice(&r[..ID_LEN]).expect("20 bytes"))
        .collect())
}

pub(super) fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

pub(super) fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// Splits the packed items of a batch into segments of at most
/// `SEGMENT_MAX` bytes of images (an item is never split).
pub(super) fn plan(items: Vec<(usize, PutItem)>) -> Vec<Vec<(usize, PutItem)>> {
    let mut groups: Vec<Vec<(usize, PutItem)>> = Vec::new();
    let mut bytes = 0u64;
    for item in items {
        let stored = item.1.sizes.stored_len();
        match groups.last_mut() {
            Some(group) if bytes + stored <= SEGMENT_MAX => {
                group.push(item);
                bytes += stored;
            }
            _ => {
                groups.push(vec![item]);
                bytes = stored;
            }
        }
    }
    groups
}

pub(super) fn read_header(
    file: &File,
    slot: Slot,
    id: &ObjectId,
    what: &str,
) -> Result<ObjectHeader> {
    let mut head = [0u8; HEADER_LEN];
    read_payload(file, &mut head, slot.offset, what)?;
    check_header(&head, slot, id, what)
}

/// The header at the start of `image` (a packed image read whole), checked
/// against the index's `slot` for `id`.
pub(super) fn check_header(
    image: &[u8],
    slot: Slot,
    id: &ObjectId,
    what: &str,
) -> Result<ObjectHeader> {
    let header = ObjectHeader::decode(&image[..HEADER_LEN], what)?;
    if header.id != *id {
        return Err(ShoalError::new(
            ErrorKind::ObjectCorrupt,
            format!("{what}: holds object {} instead", header.id),
        ));
    }
    if header.stored_len() != slot.stored {
        return Err(ShoalError::new(
            ErrorKind::ObjectCorrupt,
            format!(
                "{what}: {} bytes in the index, the header says {}",
                slot.stored,
                header.stored_len()
            ),
        ));
    }
    Ok(header)
}

/// Reads `buf.len()` bytes at `at`; a segment that ends first is corrupt.
pub(super) fn read_payload(file: &File, buf: &mut [u8], at: u64, what: &str) -> Result<()> {
    file.read_exact_at(buf, at).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ShoalError::new(ErrorKind::ObjectCorrupt, format!("{what}: truncated image"))
        } else {
            io_error(&format!("read {what}"), e)
        }
    })
}

/// A new segment file at `path`, opened to read too: the segment is served
/// from this handle once published.
pub(super) fn create_segment_file(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| io_error(&format!("write {}", path.display()), e))
}

/// Writes `items`' images, the index and the trailer to a new file at
/// `path`, then starts its write-back.
pub(super) fn write_segment(
    path: &Path,
    items: &[PutItem],
) -> Result<(File, Vec<(ObjectHeader, Slot)>)> {
    let context = || format!("write {}", path.display());
    let file = create_segment_file(path)?;
    let mut images = Vec::with_capacity(items.len());
    let mut offset = 0u64;
    let mut flushed = 0u64;
    for item in items {
        let mut crc = 0u32;
        let mut at = offset + HEADER_LEN as u64;
        for chunk in item.src.as_slice().chunks(CHUNK) {
            crc = crc32c::crc32c_append(crc, chunk);
            file.write_all_at(chunk, at)
                .map_err(|e| io_error(&context(), e))?;
            at += chunk.len() as u64;
        }
        let header = ObjectHeader {
            id: item.id,
            data_size: item.sizes.data_size,
            meta_size: item.sizes.meta_size,
            checksum: crc,
        };
        file.write_all_at(&header.encode(), offset)
            .map_err(|e| io_error(&context(), e))?;
        let stored = header.stored_len();
        images.push((
            header,
            Slot {
                seq: 0,
                offset,
                stored,
            },
        ));
        offset += stored;
        // Start the write-back of what is written so far, so the device
        // works while the rest is staged.
        if offset - flushed >= CHUNK as u64 {
            start_write_back(&file, flushed, offset - flushed);
            flushed = offset;
        }
    }
    finish_segment(&file, offset, &images, &context)?;
    Ok((file, images))
}

/// Copies the images `live` of segment `old` into a new file at `path`,
/// back to back, with index and trailer. Bytes are copied as they are (a
/// damaged image stays damaged, and is reported when read).
pub(super) fn copy_segment(old: &File, path: &Path, live: &[(ObjectId, Slot)]) -> Result<File> {
    let context = || format!("write {}", path.display());
    let file = create_segment_file(path)?;
    let mut buf = vec![0u8; CHUNK];
    let mut images = Vec::with_capacity(live.len());
    let mut offset = 0u64;
    for (id, slot) in live {
        let mut done = 0u64;
        let mut head = [0u8; HEADER_LEN];
        old.read_exact_at(&mut head, slot.offset)
            .map_err(|e| io_error(&format!("compaction read of {id}"), e))?;
        // The index keeps the header's checksum; a damaged header stays
        // damaged (copied as it is) and is reported when read.
        let checksum = ObjectHeader::decode(&head, &context()).map_or(0, |h| h.checksum);
        while done < slot.stored {
            let n = (slot.stored - done).min(CHUNK as u64) as usize;
            old.read_exact_at(&mut buf[..n], slot.offset + done)
                .map_err(|e| io_error(&format!("compaction read of {id}"), e))?;
            file.write_all_at(&buf[..n], offset + done)
                .map_err(|e| io_error(&context(), e))?;
            done += n as u64;
        }
        images.push((
            ObjectHeader {
                id: *id,
                data_size: slot.stored - HEADER_LEN as u64,
                meta_size: 0,
                checksum,
            },
            Slot {
                seq: 0,
                offset,
                stored: slot.stored,
            },
        ));
        offset += slot.stored;
    }
    finish_segment(&file, offset, &images, &context)?;
    Ok(file)
}

/// Appends the index and the trailer at `offset`, then starts write-back.
pub(super) fn finish_segment(
    file: &File,
    offset: u64,
    images: &[(ObjectHeader, Slot)],
    context: &dyn Fn() -> String,
) -> Result<()> {
    let mut index = Vec::with_capacity(images.len() * INDEX_ENTRY);
    for (header, slot) in images {
        index.extend_from_slice(header.id.as_bytes());
        index.extend_from_slice(&slot.offset.to_le_bytes());
        index.extend_from_slice(&slot.stored.to_le_bytes());
        index.extend_from_slice(&header.checksum.to_le_bytes());
    }
    let count = u32::try_from(images.len())
        .map_err(|_| ShoalError::invalid("more than 2^32 images in one segment"))?;
    let mut trailer = [0u8; TRAILER];
    trailer[0..8].copy_from_slice(&MAGIC);
    trailer[8..12].copy_from_slice(&VERSION.to_le_bytes());
    trailer[12..16].copy_from_slice(&count.to_le_bytes());
    trailer[16..24].copy_from_slice(&offset.to_le_bytes());
    trailer[24..28].copy_from_slice(&crc32c::crc32c(&index).to_le_bytes());
    let crc = crc32c::crc32c(&trailer[..28]);
    trailer[28..32].copy_from_slice(&crc.to_le_bytes());
    index.extend_from_slice(&trailer);
    file.write_all_at(&index, offset)
        .map_err(|e| io_error(&context(), e))?;
    start_write_back(file, 0, 0);
    Ok(())
}

/// Starts the write-back of `len` bytes at `offset` (0: to the end) without
/// waiting: only a hint (see `write_image`), the fsync at publish is what
/// makes the segment durable, so a failure here changes nothing.
pub(super) fn start_write_back(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a file descriptor we own.
    let _ = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
}

#[cfg(test)]
mod name_tests {
    use super::segment_file;

    #[test]
    fn only_names_the_tier_writes_are_segments() {
        assert_eq!(
            segment_file("000000000000001a.seg"),
            Some((26, "seg".into()))
        );
        assert_eq!(
            segment_file("000000000000001a.dead"),
            Some((26, "dead".into()))
        );
        for foreign in [
            "+00000000000001a.seg",
            "000000000000001A.seg",
            "00000000000001a.seg",
            "0000000000000001a.seg",
            "000000000000001a",
            "-00000000000001a.seg",
        ] {
            assert_eq!(segment_file(foreign), None, "{foreign}");
        }
    }
}
