//! Memory ranges the engine reads from (spill) and writes into (restore).
//!
//! The bytes of an object live in the daemon's shared-memory region. Copying
//! them into a `Vec` before writing a tier would double the memory traffic of
//! every spill, so the engine reads them in place: the caller hands over a
//! raw range plus a keep-alive guard, and promises (unsafely) that the range
//! stays valid for as long as the handle, and so the guard, exists. The
//! engine drops the handle as soon as it has finished with the bytes, which
//! is what lets the daemon free or reuse the memory: the guard's `Drop` is
//! the daemon's "listener is done" signal.

use std::cell::UnsafeCell;
use std::fmt;
use std::sync::Arc;

/// Something whose lifetime keeps a memory range valid: the mapping of the
/// region, a pin on the object in the store, or an owned buffer. Dropped
/// (possibly on a blocking thread) when the engine is done with the range.
pub type KeepAlive = Arc<dyn std::any::Any + Send + Sync>;

/// A read-only view of `len` bytes at `ptr`: an object's data followed by its
/// metadata, as laid out in the region.
pub struct SourceRange {
    ptr: *const u8,
    len: usize,
    _keep_alive: KeepAlive,
}

// SAFETY: the range is only read, and the constructor's contract makes the
// bytes valid and unmodified from any thread for as long as the handle lives.
unsafe impl Send for SourceRange {}
// SAFETY: shared access only reads (see `Send`).
unsafe impl Sync for SourceRange {}

impl SourceRange {
    /// A view of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// From this call until the returned value and every clone of it are
    /// dropped (the engine may keep
    /// it past the end of the future that received it, e.g. when that future is
    /// cancelled while a blocking write still runs; it always drops it when it
    /// is done), the `len` bytes at `ptr` must be mapped, readable, and not
    /// written by anyone. `keep_alive` is dropped with the handle: tie the
    /// lifetime of the mapping and of the object's pin to it.
    pub unsafe fn new(ptr: *const u8, len: usize, keep_alive: KeepAlive) -> Self {
        Self {
            ptr,
            len,
            _keep_alive: keep_alive,
        }
    }

    /// A range over an owned buffer (tier-to-tier copies, tests). Safe: the
    /// buffer itself is the keep-alive and is never written again.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let owner: Arc<Vec<u8>> = Arc::new(bytes);
        let (ptr, len) = (owner.as_ptr(), owner.len());
        // SAFETY: the Vec is owned by the keep-alive, immutable behind the Arc,
        // and lives as long as the handle.
        unsafe { Self::new(ptr, len, owner) }
    }

    /// Bytes in the range: the object's payload (data + metadata).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is 0 bytes long (an object with neither data nor
    /// metadata).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, in place: no copy is made.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: valid, unmodified bytes for the life of `self` (constructor contract).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Another handle on the same bytes (a drain job keeps one to retry with);
/// the keep-alive lives until the last handle goes.
impl Clone for SourceRange {
    fn clone(&self) -> Self {
        Self {
            ptr: self.ptr,
            len: self.len,
            _keep_alive: self._keep_alive.clone(),
        }
    }
}

impl AsRef<[u8]> for SourceRange {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for SourceRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SourceRange({:p}, {} bytes)", self.ptr, self.len)
    }
}

/// A writable range of `len` bytes at `ptr` that a restore fills: memory the
/// daemon allocated for the object and publishes only after the restore
/// succeeded. On error its contents are unspecified.
pub struct DestRange {
    ptr: *mut u8,
    len: usize,
    _keep_alive: KeepAlive,
}

// SAFETY: the constructor's contract gives the handle exclusive access to the
// bytes for its whole life, from whichever thread holds it.
unsafe impl Send for DestRange {}

impl DestRange {
    /// A writable view of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// From this call until the returned value is dropped (which may be after
    /// the future that received it was cancelled), the `len` bytes at `ptr`
    /// must be mapped, writable, and neither read nor written by anyone else.
    /// `keep_alive` is dropped with the handle.
    pub unsafe fn new(ptr: *mut u8, len: usize, keep_alive: KeepAlive) -> Self {
        Self {
            ptr,
            len,
            _keep_alive: keep_alive,
        }
    }

    /// A range over a fresh zeroed buffer, returned by [`DestBuffer::take`]
    /// once the handle is dropped (tier-to-tier copies, tests).
    pub fn buffer(len: usize) -> (Self, DestBuffer) {
        let owner = Arc::new(OwnedBuffer(UnsafeCell::new(vec![0u8; len])));
        // SAFETY: nobody else has the buffer yet.
        let ptr = unsafe { (*owner.0.get()).as_mut_ptr() };
        // SAFETY: the Vec is kept alive by the Arc and never reallocated; the
        // only other handle (`DestBuffer`) reads it only once this handle, the
        // sole writer, is gone (`Arc::into_inner`).
        let range = unsafe { Self::new(ptr, len, owner.clone()) };
        (range, DestBuffer(owner))
    }

    /// Bytes the restore fills: exactly the object's payload length (a tier
    /// refuses any other).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is 0 bytes long (an object with neither data nor
    /// metadata).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes to fill, in place.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: exclusive, valid bytes for the life of `self` (constructor contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The bytes as filled so far; unspecified after a failed read.
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: as above; shared access through `&self` only reads.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl fmt::Debug for DestRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DestRange({:p}, {} bytes)", self.ptr, self.len)
    }
}

struct OwnedBuffer(UnsafeCell<Vec<u8>>);

// SAFETY: the buffer is written only through the one `DestRange` over it and
// read only after that handle is gone (`DestBuffer::take`).
unsafe impl Send for OwnedBuffer {}
// SAFETY: as for `Send`: never accessed from two threads at once.
unsafe impl Sync for OwnedBuffer {}

/// The owned buffer behind [`DestRange::buffer`].
pub struct DestBuffer(Arc<OwnedBuffer>);

impl DestBuffer {
    /// The bytes, once the [`DestRange`] was dropped; `None` while it lives.
    pub fn take(self) -> Option<Vec<u8>> {
        Arc::into_inner(self.0).map(|owned| owned.0.into_inner())
    }
}
