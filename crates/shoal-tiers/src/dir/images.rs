//! Object images as files, one per object: `objects/<xx>/<id>`, named by
//! `path_of`. A put stages the image under `tmp/` (written with direct I/O
//! where the file system takes it) and names it once it is durable; reads,
//! verifies and deletes of a file image (a packed copy, if there is one,
//! answers first: packed.rs).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use shoal_core::error::{ErrorKind, Result, ShoalError};
use shoal_core::ids::ObjectId;

use crate::format::{check_destination, checksum_mismatch, ObjectHeader, ObjectSizes, HEADER_LEN};
use crate::range::{DestRange, SourceRange};

use super::direct::{
    read_payload_direct, read_range_direct, reopen_direct, reopen_direct_for_write,
    write_image_direct, DIRECT_MIN, PACKED_DIRECT_MIN,
};
use super::io::{copy_checksummed, in_parallel, io_error, sync_dir, CHUNK, READ_SLICE};
use super::tier::{Inner, Staged, OBJECTS, TMP};

impl Inner {
    pub(super) fn path_of(&self, id: &ObjectId) -> PathBuf {
        let hex = id.to_hex();
        self.root.join(OBJECTS).join(&hex[..2]).join(hex)
    }

    /// First half of a put: takes the capacity and writes the image under
    /// `tmp/`, checksumming as it goes, and starts its write-back. Nothing
    /// is durable or visible yet; [`publish`](Self::publish) finishes it. On
    /// error nothing is left (no temp file, no capacity taken).
    pub(super) fn stage(
        &self,
        id: ObjectId,
        sizes: ObjectSizes,
        src: SourceRange,
    ) -> Result<Staged> {
        if src.len() as u64 != sizes.payload_len() {
            return Err(ShoalError::invalid(format!(
                "object {id}: source range of {} bytes for {} + {} bytes",
                src.len(),
                sizes.data_size,
                sizes.meta_size
            )));
        }
        let stored = HEADER_LEN as u64 + sizes.payload_len();
        self.reserve(stored)?;
        let mut nonce = [0u8; 8];
        if let Err(e) = getrandom::fill(&mut nonce) {
            self.unreserve(stored);
            return Err(ShoalError::io("random temp name", e));
        }
        let tmp = self.root.join(TMP).join(format!(
            "{}.{:016x}",
            id.to_hex(),
            u64::from_le_bytes(nonce)
        ));
        let written = write_image(id, sizes, &src, &tmp);
        drop(src); // the caller may reuse its memory from here on
        match written {
            Ok((file, header)) => Ok(Staged {
                id,
                tmp,
                file,
                header,
                stored,
            }),
            Err(err) => {
                let _ = fs::remove_file(&tmp);
                self.unreserve(stored);
                Err(err)
            }
        }
    }

    /// Renames synced file images to their final names and fsyncs each
    /// directory touched once.
    pub(super) fn name(&self, synced: Vec<Result<Staged>>) -> Vec<Result<ObjectHeader>> {
        // Names: a rename replaces an older image of the same id atomically.
        let mut dirs: Vec<PathBuf> = Vec::new();
        let renamed: Vec<Result<(ObjectHeader, PathBuf)>> = synced
            .into_iter()
            .map(|image| {
                let image = image?;
                let path = self.path_of(&image.id);
                let replaced = fs::metadata(&path).ok().map(|m| m.len());
                if let Err(e) = fs::rename(&image.tmp, &path) {
                    return Err(self.discard(
                        &image,
                        io_error(&format!("rename to {}", path.display()), e),
                    ));
                }
                // From here the image is in place: account for it whatever
                // the directory sync below says.
                self.changed(image.id, true);
                match replaced {
                    Some(old) => self.unreserve(old),
                    None => {
                        self.objects.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let dir = path
                    .parent()
                    .expect("object paths have a parent")
                    .to_path_buf();
                if !dirs.contains(&dir) {
                    dirs.push(dir.clone());
                }
                Ok((image.header, dir))
            })
            .collect();
        // The renames, durable: one fsync per directory (the first commits
        // the file system's journal for all of them; the rest find it done).
        let outcomes = in_parallel(&dirs, |dir| File::open(dir).and_then(|d| d.sync_all()));
        let failed: Vec<(PathBuf, ShoalError)> = dirs
            .into_iter()
            .zip(outcomes)
            .filter_map(|(dir, synced)| {
                synced.err().map(|e| {
                    let err = io_error(&format!("fsync directory {}", dir.display()), e);
                    (dir, err)
                })
            })
            .collect();
        renamed
            .into_iter()
            .map(|outcome| {
                let (header, dir) = outcome?;
                match failed.iter().find(|(d, _)| *d == dir) {
                    // In place but maybe not durable: the caller must not
                    // count on it (recovery adopts it, or a retry replaces it).
                    Some((_, err)) => Err(err.clone()),
                    None => self.drop_packed_copy(&header.id).map(|()| header),
                }
            })
            .collect()
    }

    /// Drops a staged image that will not be published; returns `err`.
    pub(super) fn discard(&self, image: &Staged, err: ShoalError) -> ShoalError {
        let _ = fs::remove_file(&image.tmp);
        self.unreserve(image.stored);
        err
    }

    /// Opens `id`'s image and checks its header against `id` (and its length
    /// against the file's), returning the file positioned at the payload.
    fn open_image(&self, id: &ObjectId) -> Result<(File, ObjectHeader, String)> {
        let path = self.path_of(id);
        let what = path.display().to_string();
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ShoalError::new(
                    ErrorKind::ObjectNotFound,
                    format!("object {id} is not on tier {}", self.root.display()),
                ))
            }
            Err(e) => return Err(io_error(&format!("open {what}"), e)),
        };
        let mut head = [0u8; HEADER_LEN];
        let got =
            read_full(&mut file, &mut head).map_err(|e| io_error(&format!("read {what}"), e))?;
        let header = ObjectHeader::decode(&head[..got], &what)?;
        if header.id != *id {
            return Err(ShoalError::new(
                ErrorKind::ObjectCorrupt,
                format!("{what}: holds object {} instead", header.id),
            ));
        }
        let len = file
            .metadata()
            .map_err(|e| io_error(&format!("stat {what}"), e))?
            .len();
        if len != header.stored_len() {
            return Err(ShoalError::new(
                ErrorKind::ObjectCorrupt,
                format!(
                    "{what}: {len} bytes, the header says {}",
                    header.stored_len()
                ),
            ));
        }
        Ok((file, header, what))
    }

    /// Reads `id` into `dst`. A file image outranks a packed copy of the
    /// same id, as at open (`walk_at_open`): both are on disk only after a
    /// replace that could not remove the other, and a read must answer what
    /// a reopen would.
    pub(super) fn get(&self, id: ObjectId, dst: &mut DestRange) -> Result<ObjectHeader> {
        drop(self.walked()?);
        let (mut file, header, what) = match self.open_image(&id) {
            Ok(found) => found,
            Err(e) if e.kind() == ErrorKind::ObjectNotFound => {
                return self.get_packed(&id, dst.as_mut_slice())?.ok_or(e);
            }
            Err(e) => return Err(e),
        };
        check_destination(&id, dst.len() as u64, header.payload_len())?;
        let len = header.payload_len();
        // Large images: direct reads of 4 MiB blocks with a reader thread;
        // medium ones: one direct read; small ones (or no O_DIRECT here):
        // buffered reads.
        let direct = (len >= PACKED_DIRECT_MIN)
            .then(|| reopen_direct(&file))
            .flatten();
        let crc = match direct {
            Some(direct) if len >= DIRECT_MIN => {
                read_payload_direct(&direct, dst.as_mut_slice())
                    .map_err(|e| io_error(&format!("read {what}"), e))?
            }
            Some(direct) => read_range_direct(&direct, HEADER_LEN as u64, len as usize, |src| {
                copy_checksummed(dst.as_mut_slice(), src, 0)
            })
            .map_err(|e| io_error(&format!("read {what}"), e))?,
            None => {
                let mut crc = 0u32;
                for chunk in dst.as_mut_slice().chunks_mut(READ_SLICE) {
                    file.read_exact(chunk)
                        .map_err(|e| io_error(&format!("read {what}"), e))?;
                    crc = crc32c::crc32c_append(crc, chunk);
                }
                crc
            }
        };
        if crc != header.checksum {
            return Err(checksum_mismatch(&what, header.checksum, crc));
        }
        Ok(header)
    }

    /// `id`'s image header (a file, else packed), checked against `id`, its
    /// own checksum and the image's length, without reading the payload.
    pub(super) fn header(&self, id: ObjectId) -> Result<ObjectHeader> {
        drop(self.walked()?);
        // (`open_image` checks the id and the file's length too.)
        match self.open_image(&id) {
            Err(e) if e.kind() == ErrorKind::ObjectNotFound => {
                let Some((file, slot, path)) = self.segments.find(&id) else {
                    return Err(e);
                };
                let what = format!("{} at {}", path.display(), slot.offset);
                super::segments::read_header(&file, slot, &id, &what)
            }
            found => found.map(|(_, header, _)| header),
        }
    }

    pub(super) fn verify(&self, id: ObjectId) -> Result<ObjectHeader> {
        drop(self.walked()?);
        let (mut file, header, what) = match self.open_image(&id) {
            Ok(found) => found,
            Err(e) if e.kind() == ErrorKind::ObjectNotFound => {
                return self.verify_packed(&id)?.ok_or(e);
            }
            Err(e) => return Err(e),
        };
        let mut buf = vec![0u8; CHUNK.min(header.payload_len() as usize)];
        let (mut left, mut crc) = (header.payload_len(), 0u32);
        while left > 0 {
            let n = (left as usize).min(buf.len());
            file.read_exact(&mut buf[..n])
                .map_err(|e| io_error(&format!("read {what}"), e))?;
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            left -= n as u64;
        }
        if crc != header.checksum {
            return Err(checksum_mismatch(&what, header.checksum, crc));
        }
        Ok(header)
    }

    pub(super) fn delete(&self, id: ObjectId) -> Result<bool> {
        self.wait_counted();
        let packed = self.delete_packed(&id)?.is_some();
        let path = self.path_of(&id);
        let len = match fs::metadata(&path) {
            Ok(meta) => meta.len(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(packed),
            Err(e) => return Err(io_error(&format!("stat {}", path.display()), e)),
        };
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(packed),
            Err(e) => return Err(io_error(&format!("remove {}", path.display()), e)),
        }
        // Gone from the directory: accounted for whatever the sync says.
        self.changed(id, false);
        self.unreserve(len);
        self.objects.fetch_sub(1, Ordering::Relaxed);
        sync_dir(path.parent().expect("object paths have a parent"))?;
        Ok(true)
    }
}

/// Writes the image of `id` to `tmp` (a new file) in one pass over the
/// source: checksum a chunk while it is in cache, write it, and put the
/// header (which holds the checksum) in front at the end. Direct writes
/// (`direct.rs`) where the file system takes them; through the page cache
/// otherwise, and then starts the write-back of the whole file without
/// waiting for it, so a batch's fsyncs find their data already on its way.
fn write_image(
    id: ObjectId,
    sizes: ObjectSizes,
    src: &SourceRange,
    tmp: &Path,
) -> Result<(File, ObjectHeader)> {
    use std::os::fd::AsRawFd;

    let context = || format!("write {}", tmp.display());
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(tmp)
        .map_err(|e| io_error(&context(), e))?;
    let header = |checksum| ObjectHeader {
        id,
        data_size: sizes.data_size,
        meta_size: sizes.meta_size,
        checksum,
    };
    if let Some(direct) = reopen_direct_for_write(&file) {
        let end = HEADER_LEN as u64 + src.len() as u64;
        match write_image_direct(&direct, src.as_slice(), |crc| header(crc).encode())
            .and_then(|crc| direct.set_len(end).map(|()| crc))
        {
            Ok(crc) => return Ok((file, header(crc))),
            // Direct writes refused here: start again through the cache.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                file.set_len(0).map_err(|e| io_error(&context(), e))?
            }
            Err(e) => return Err(io_error(&context(), e)),
        }
    }
    let mut crc = 0u32;
    let mut offset = HEADER_LEN as u64;
    for chunk in src.as_slice().chunks(CHUNK) {
        crc = crc32c::crc32c_append(crc, chunk);
        file.write_all_at(chunk, offset)
            .map_err(|e| io_error(&context(), e))?;
        offset += chunk.len() as u64;
    }
    let header = header(crc);
    file.write_all_at(&header.encode(), 0)
        .map_err(|e| io_error(&context(), e))?;
    file.flush().map_err(|e| io_error(&context(), e))?;
    // Neither nix nor rustix wraps sync_file_range. It only starts the
    // write-back (a hint): the fsync in `publish` is what makes it durable,
    // so a failure here changes nothing and is ignored.
    // SAFETY: a plain system call on a file descriptor we own.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    Ok((file, header))
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
