//! Open files. A file opened for reading holds a reference to the sealed
//! object its name was bound to at open (a rewrite meanwhile does not
//! change what it reads, as with a file replaced by rename on a local file
//! system). A file opened for writing gets its own growable buffer, filled
//! from the current version unless truncated, and written as a new object
//! under the name when closed: a version is always one writer's whole
//! file, never a mix (last close wins).
//!
//! Why a buffer in this process rather than an unsealed object in the
//! store: a store object has a fixed size at create, and writes at any
//! offset may grow a file; re-creating a larger object on every growth
//! would copy the file each time and keep an unsealed object of a guessed
//! maximum size. The buffer costs one copy at close (`put_named`), at
//! memory bandwidth.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use libc::c_int;
use shoal_core::ObjectId;

/// A sealed object's bytes in this process's mapping of the region.
pub struct Sealed {
    pub id: ObjectId,
    /// Address in the client's mapping (kept as an integer so the handle
    /// can be shared by the session threads).
    address: usize,
    len: usize,
}

impl Sealed {
    /// # Safety
    /// `address..address + len` must lie in the client's mapping, in an
    /// object referenced until this handle is released.
    pub unsafe fn new(id: ObjectId, address: *const u8, len: usize) -> Self {
        Self {
            id,
            address: address as usize,
            len,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the constructor's contract: the range is mapped and the
        // object referenced (so neither freed nor written) while we live.
        unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len) }
    }
}

/// A file being written.
pub struct Writer {
    pub path: String,
    pub ino: u64,
    pub buf: Vec<u8>,
    /// Written since the last commit.
    pub dirty: bool,
    /// Its name was unlinked while open: closing it writes nothing.
    pub unlinked: bool,
    /// Another writer had the same file open meanwhile: the kernel's page
    /// cache of the file mixes both writers' bytes, so it must not be kept
    /// for the version this one writes.
    pub shared: bool,
    /// False for a read-only open's copy of a buffer still being written.
    pub writable: bool,
}

impl Writer {
    pub fn new(path: String, ino: u64, buf: Vec<u8>, dirty: bool) -> Self {
        Self {
            path,
            ino,
            buf,
            dirty,
            unlinked: false,
            shared: false,
            writable: true,
        }
    }

    /// Writes `data` at `offset`, growing the file (with zeros in any gap)
    /// up to `max` bytes; beyond it EFBIG.
    pub fn write(&mut self, offset: u64, data: &[u8], max: u64) -> Result<usize, c_int> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&end| end <= max)
            .ok_or(libc::EFBIG)?;
        let (offset, end) = (offset as usize, end as usize);
        if offset > self.buf.len() {
            self.buf.resize(offset, 0); // the gap reads as zeros
        }
        // Overwrite what is there, append the rest (no zero-fill first:
        // sequential writes touch each byte once).
        let inside = (self.buf.len() - offset).min(data.len());
        self.buf[offset..offset + inside].copy_from_slice(&data[..inside]);
        self.buf.extend_from_slice(&data[inside..]);
        debug_assert!(self.buf.len() >= end);
        self.dirty = true;
        Ok(data.len())
    }

    pub fn truncate(&mut self, size: u64, max: u64) -> Result<(), c_int> {
        if size > max {
            return Err(libc::EFBIG);
        }
        self.buf.resize(size as usize, 0);
        self.dirty = true;
        Ok(())
    }
}

/// An open file. Handles are shared (`Arc`) so that reads and writes of
/// different files, and reads of one sealed file, run on several session
/// threads at once; a writer's buffer has its own lock.
pub enum Handle {
    Reader(Sealed),
    Writer(Mutex<Writer>),
}

/// Locks `m`. A thread that panicked while holding it left a buffer that is
/// still a valid (if partial) file, so the poison is ignored rather than
/// taking the whole mount down.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads `size` bytes at `offset` of `bytes` (short at the end).
pub fn slice_at(bytes: &[u8], offset: u64, size: u32) -> &[u8] {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    &bytes[start..end]
}

#[derive(Default)]
pub struct Handles {
    open: HashMap<u64, Arc<Handle>>,
    next: u64,
}

impl Handles {
    pub fn insert(&mut self, handle: Handle) -> u64 {
        self.next += 1;
        self.open.insert(self.next, Arc::new(handle));
        self.next
    }

    pub fn get(&self, fh: u64) -> Option<Arc<Handle>> {
        self.open.get(&fh).cloned()
    }

    pub fn remove(&mut self, fh: u64) -> Option<Arc<Handle>> {
        self.open.remove(&fh)
    }

    pub fn writers(&self) -> impl Iterator<Item = &Mutex<Writer>> {
        self.open.values().filter_map(|h| match h.as_ref() {
            Handle::Writer(w) => Some(w),
            Handle::Reader(_) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_grow_fill_gaps_and_stop_at_the_limit() {
        let mut w = Writer::new("f".into(), 2, Vec::new(), false);
        assert_eq!(w.write(4, b"xy", 100), Ok(2));
        assert_eq!(w.buf, b"\0\0\0\0xy");
        w.write(1, b"ab", 100).unwrap();
        assert_eq!(w.buf, b"\0ab\0xy");
        assert_eq!(w.write(99, b"zz", 100), Err(libc::EFBIG));
        assert_eq!(w.write(u64::MAX, b"z", u64::MAX), Err(libc::EFBIG));
        w.truncate(2, 100).unwrap();
        assert_eq!(w.buf, b"\0a");
        assert!(w.dirty);
        assert_eq!(slice_at(b"hello", 3, 10), b"lo");
        assert_eq!(slice_at(b"hello", 9, 10), b"");
    }
}
