//! Regions: the shared memory a node owns and clients map.
//!
//! A region is any mmap-able path: a file in /dev/shm (the default), a file on
//! hugetlbfs, a DAX device. The daemon creates or opens it, maps it once, and
//! pre-faults it in the background so no client pays page faults on memory
//! that is reused. Clients receive the open file descriptor over the socket
//! (SCM_RIGHTS) and map the same pages; nothing is ever copied through the
//! socket. A client fills its page tables per [`POPULATE_CHUNK`] on first use
//! (not the whole region at connect, which took ~24 s for 8 GiB here), and
//! freed ranges can be given back to the kernel ([`Region::release_pages`]).

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};

use crate::error::{Result, ShoalError};
use crate::populate::{page_size, populate, populate_for_reading};

/// The daemon's region: the file, its length and the daemon's mapping.
pub struct Region {
    path: PathBuf,
    file: File,
    map: MmapRaw,
    unlink_on_drop: bool,
}

impl Region {
    /// Creates a fresh region file of `len` bytes at `path` (mode 0600, so it
    /// is not world-accessible), maps it and unlinks the name. Fails if the path exists: two
    /// daemons must never share a region by accident.
    pub fn create(path: &Path, len: u64) -> Result<Self> {
        let region = Self::create_file(path, len, false)?;
        // Clients receive the fd, never the path: unlinking at once means a
        // daemon that crashes leaves no shared memory behind. (Only a file
        // this call made: a path that existed is someone else's.)
        let _ = std::fs::remove_file(path);
        Ok(region)
    }

    /// A new 0600 file of `len` bytes at `path`, mapped.
    fn create_file(path: &Path, len: u64, unlink_on_drop: bool) -> Result<Self> {
        if len == 0 {
            return Err(ShoalError::invalid("region length must be positive"));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| ShoalError::io(&format!("create region {}", path.display()), e))?;
        let sized = file.set_len(len).map_err(|e| {
            ShoalError::io(&format!("size region {} to {len} bytes", path.display()), e)
        });
        let region = sized.and_then(|()| Self::map(path, file, len, unlink_on_drop));
        if region.is_err() {
            // The file is ours (created above): leave nothing behind.
            let _ = std::fs::remove_file(path);
        }
        region
    }

    /// Creates a region file that stays at `path` while the daemon runs, so
    /// other nodes' clients can map it by name (cluster mapped mode), and is
    /// removed when the region is dropped. A file left by a daemon that died
    /// is replaced (the caller holds the node's lock).
    ///
    /// The file carries `generation` (the daemon's incarnation) in a trailer
    /// after the region's `len` bytes, never mapped: a client that mapped the
    /// file reads it ([`Mapping::generation`]) and so knows which incarnation
    /// of the node its mapping shows. The file is complete (sized, trailer
    /// written) before it appears at `path`: it is built under a temporary
    /// name and renamed over whatever was there, so a client never opens a
    /// region without its generation.
    pub fn create_shared(path: &Path, len: u64, generation: u64) -> Result<Self> {
        let name = path
            .file_name()
            .ok_or_else(|| ShoalError::invalid(format!("region path {}", path.display())))?;
        let building = path.with_file_name(format!(
            ".{}.{}.new",
            name.to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&building);
        let region = Self::create_file(&building, len, true).and_then(|mut region| {
            region.write_trailer(generation)?;
            std::fs::rename(&building, path).map_err(|e| {
                ShoalError::io(&format!("rename region into {}", path.display()), e)
            })?;
            region.path = path.to_owned();
            Ok(region)
        });
        if region.is_err() {
            let _ = std::fs::remove_file(&building);
        }
        region
    }

    /// Grows the file by the trailer and writes `generation` into it.
    fn write_trailer(&mut self, generation: u64) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let len = self.len();
        self.file
            .set_len(len + TRAILER_LEN)
            .map_err(|e| ShoalError::io("size the region's trailer", e))?;
        self.file
            .write_all_at(&trailer(generation), len)
            .map_err(|e| ShoalError::io("write the region's trailer", e))
    }

    /// Opens an existing mmap-able path (hugetlbfs file, DAX device) of the
    /// given length. The path is left in place on drop.
    pub fn open(path: &Path, len: u64) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| ShoalError::io(&format!("open region {}", path.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| ShoalError::io("stat region", e))?;
        if meta.file_type().is_file() && meta.len() < len {
            file.set_len(len)
                .map_err(|e| ShoalError::io(&format!("size region {}", path.display()), e))?;
        }
        Self::map(path, file, len, false)
    }

    fn map(path: &Path, file: File, len: u64, unlink_on_drop: bool) -> Result<Self> {
        let map = MmapOptions::new()
            .len(usize::try_from(len).map_err(|_| ShoalError::invalid("region too large"))?)
            .map_raw(&file)
            .map_err(|e| {
                ShoalError::io(&format!("mmap region {} ({len} bytes)", path.display()), e)
            })?;
        Ok(Self {
            path: path.to_owned(),
            file,
            map,
            unlink_on_drop,
        })
    }

    /// Where the region was created or opened. After [`Region::create`] the name is already
    /// unlinked: only for messages then.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The region's length in bytes: what the daemon mapped and clients map (a shared region's
    /// trailer not counted).
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the region has no bytes (never, as built: a region's length is positive).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The region's file: what the daemon passes to each client at the handshake (SCM_RIGHTS).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The start of the daemon's mapping: offsets on the wire count from here.
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Faults in every page of the region (allocating it in the page cache),
    /// in chunks so a background caller can be interrupted between them.
    /// Returns how many bytes were populated.
    pub fn prefault(&self, chunk: usize, keep_going: impl Fn() -> bool) -> u64 {
        self.prefault_up_to(chunk, || if keep_going() { u64::MAX } else { 0 })
    }

    /// Faults in the region from its start, chunk by chunk, while the chunk
    /// begins below `limit()` (asked before each chunk; 0 stops at once).
    /// Returns how many bytes were populated. (An elastic daemon populates
    /// its region through `allocate_pages` instead, following its target.)
    pub fn prefault_up_to(&self, chunk: usize, limit: impl Fn() -> u64) -> u64 {
        let len = self.map.len();
        let mut done = 0;
        while done < len && (done as u64) < limit() {
            let n = chunk.min(len - done);
            // SAFETY: the range lies inside our own live mapping.
            unsafe { populate(self.base().add(done), n, true) };
            done += n;
        }
        done as u64
    }

    /// [`prefault`](Self::prefault) from a thread that only runs when no
    /// other thread wants its core (SCHED_IDLE), in chunks of
    /// [`POPULATE_CHUNK`] (a populate holds the process's memory map lock,
    /// which the daemon's own allocations may need), so faulting the region
    /// in does not delay requests: the calling thread keeps that policy.
    /// Stops when `keep_going()` turns false.
    pub fn prefault_in_background(&self, keep_going: impl Fn() -> bool) -> u64 {
        let chunk = POPULATE_CHUNK as usize;
        // SAFETY: sched_setscheduler on the calling thread (0) with a valid
        // param struct; failure only leaves the priority as it was.
        unsafe {
            let param = libc::sched_param { sched_priority: 0 };
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param);
        }
        self.prefault(chunk, keep_going)
    }

    /// Gives the memory behind `[offset, offset + len)` back to the kernel:
    /// the file's pages there are freed (a hole is punched in it) and every
    /// mapping of them, the daemon's and its clients', reads zeros from now
    /// on and allocates afresh on the next write. Only whole pages (of the
    /// file system's block size: 4 KiB on tmpfs, the huge page on hugetlbfs)
    /// inside the range are released; returns how many bytes that was.
    ///
    /// For ranges no object occupies (freed by the allocator): shrinking the
    /// capacity frees memory only this way.
    pub fn release_pages(&self, offset: u64, len: u64) -> Result<u64> {
        let Some((start, stop)) = self.whole_pages("release", offset, len)? else {
            return Ok(0);
        };
        let (start_i, length_i) = (start as libc::off_t, (stop - start) as libc::off_t);
        // SAFETY: fallocate on our own descriptor; KEEP_SIZE leaves the
        // file's length (and so every mapping's extent) unchanged.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                start_i,
                length_i,
            )
        };
        if rc == 0 {
            return Ok(stop - start);
        }
        let punch = std::io::Error::last_os_error();
        // A file system without hole punching may still free through the
        // mapping (MADV_REMOVE); devices (DAX) support neither.
        // SAFETY: a page-aligned range inside our own live mapping.
        let rc = unsafe {
            libc::madvise(
                self.base().add(start as usize).cast(),
                (stop - start) as usize,
                libc::MADV_REMOVE,
            )
        };
        if rc == 0 {
            Ok(stop - start)
        } else {
            Err(ShoalError::io(
                &format!(
                    "give [{start}, {stop}) of region {} back to the kernel",
                    self.path.display()
                ),
                punch,
            ))
        }
    }

    /// Allocates the memory behind the whole pages inside
    /// `[offset, offset + len)` (the opposite of
    /// [`release_pages`](Self::release_pages)): holes get zeroed pages, pages
    /// already there, and the bytes of every object, are left as they are,
    /// so a free range may be allocated while the allocator hands it out.
    /// Through the file (`fallocate`), not a mapping: it takes no memory-map
    /// lock and fills no page tables. Returns the whole pages' length.
    pub fn allocate_pages(&self, offset: u64, len: u64) -> Result<u64> {
        let Some((start, stop)) = self.whole_pages("allocation", offset, len)? else {
            return Ok(0);
        };
        // SAFETY: fallocate (mode 0, KEEP_SIZE) on our own descriptor; it
        // only adds pages, never changes data or the file's length.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_KEEP_SIZE,
                start as libc::off_t,
                (stop - start) as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(stop - start)
        } else {
            Err(ShoalError::io(
                &format!(
                    "allocate [{start}, {stop}) of region {}",
                    self.path.display()
                ),
                std::io::Error::last_os_error(),
            ))
        }
    }

    /// The whole pages (of the file's block size) inside `[offset, offset +
    /// len)` as `(start, stop)`, `None` if there is none; an error if the
    /// range leaves the region.
    fn whole_pages(&self, what: &str, offset: u64, len: u64) -> Result<Option<(u64, u64)>> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.len())
            .ok_or_else(|| {
                ShoalError::invalid(format!(
                    "{what} of [{offset}, +{len}) outside a region of {} bytes",
                    self.len()
                ))
            })?;
        let granule = self.block_size();
        let start = offset.next_multiple_of(granule);
        let stop = end - end % granule;
        Ok((stop > start).then_some((start, stop)))
    }

    /// The unit in which the region's file allocates memory (and frees it).
    fn block_size(&self) -> u64 {
        // SAFETY: fstatfs writes into the struct we own.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: our own descriptor and a struct of the right type.
        let rc = unsafe { libc::fstatfs(self.file.as_raw_fd(), &mut fs) };
        let page = page_size() as u64;
        if rc == 0 && fs.f_bsize > 0 {
            (fs.f_bsize as u64).max(page)
        } else {
            page
        }
    }

    /// Bytes of memory the region's file holds now (allocated pages).
    pub fn resident_bytes(&self) -> Result<u64> {
        let meta = self
            .file
            .metadata()
            .map_err(|e| ShoalError::io("stat region", e))?;
        Ok(std::os::unix::fs::MetadataExt::blocks(&meta) * 512)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.unlink_on_drop {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Whether a path is a character device (DAX) — such regions are never truncated.
pub fn is_device(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_char_device() || m.file_type().is_block_device())
        .unwrap_or(false)
}

/// Bytes after a cluster node's region, in its file: magic, then the
/// region's generation (little-endian u64), then zeros.
pub const TRAILER_LEN: u64 = 32;
const TRAILER_MAGIC: [u8; 8] = *b"SHOALGEN";

fn trailer(generation: u64) -> [u8; TRAILER_LEN as usize] {
    let mut bytes = [0u8; TRAILER_LEN as usize];
    bytes[..8].copy_from_slice(&TRAILER_MAGIC);
    bytes[8..16].copy_from_slice(&generation.to_le_bytes());
    bytes
}

/// The generation in the trailer of a region file of `len` bytes (0: none).
fn read_generation(file: &File, len: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut bytes = [0u8; TRAILER_LEN as usize];
    match file.read_exact_at(&mut bytes, len) {
        Ok(()) if bytes[..8] == TRAILER_MAGIC => {
            u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"))
        }
        _ => 0,
    }
}

/// The generation of the region file at `path` now (a cluster node's region
/// of `len` bytes; 0 if it has none), without mapping it.
pub fn file_generation(path: &Path, len: u64) -> Result<u64> {
    let file = File::open(path)
        .map_err(|e| ShoalError::io(&format!("open peer region {}", path.display()), e))?;
    Ok(read_generation(&file, len))
}

/// A client fills the page tables of its mapping of the region this much at
/// a time, on first use of any byte of it: one system call per 2 MiB in the
/// life of the process, and no page faults on later reads and writes there.
pub const POPULATE_CHUNK: u64 = 2 << 20;

/// A client's mapping of a region received as a file descriptor.
pub struct Mapping {
    /// Shared with the populating thread while it fills a range of it.
    map: Arc<MmapRaw>,
    /// For a peer's region mapped by path: the generation its file carries
    /// (the incarnation of the daemon that made it; 0 if none).
    generation: u64,
    /// One bit per [`POPULATE_CHUNK`], set once this process populated it;
    /// empty when the mapping is not populated on use.
    populated: Box<[AtomicU64]>,
}

impl Mapping {
    /// Maps `len` bytes of the region behind `fd`, shared and writable (clients
    /// write objects they create; get buffers are handed out read-only).
    /// With `populate_on_use` (the daemon keeps the region resident) the
    /// page tables of each [`POPULATE_CHUNK`] are filled the first time
    /// [`populate_on_use`](Self::populate_on_use) is asked for a range in
    /// it, so neither writes nor reads of objects take page faults after
    /// that. Populating the whole region at connect (MAP_POPULATE) made a
    /// client of an 8 GiB store wait ~24 s for its first call while the
    /// daemon was still faulting the region in. Without it, pages fault in
    /// on first touch (populating would allocate memory the daemon does not
    /// keep resident).
    pub fn map(fd: BorrowedFd<'_>, len: u64, populate_on_use: bool) -> Result<Self> {
        let map = MmapOptions::new()
            .len(usize::try_from(len).map_err(|_| ShoalError::invalid("region too large"))?)
            .map_raw(fd.as_raw_fd())
            .map_err(|e| ShoalError::io("mmap the store's region", e))?;
        let chunks = if populate_on_use {
            len.div_ceil(POPULATE_CHUNK).div_ceil(64) as usize
        } else {
            0
        };
        Ok(Self {
            map: Arc::new(map),
            generation: 0,
            populated: (0..chunks).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Fills the page tables of `[offset, offset + len)` for a write about
    /// to cover it: through [`populate_on_use`](Self::populate_on_use) when
    /// this mapping tracks its chunks (each chunk once in the life of the
    /// process: populating pages whose entries are already there still
    /// walks every one of them, ~2 ms per 64 MiB, measured as 5 % of the
    /// POSIX view's CPU writing 1 MiB blocks), else the whole range now.
    /// Both ways ignore an empty range or one outside the mapping.
    pub fn populate_for_writing(&self, offset: u64, len: u64) {
        if self.populated.is_empty() {
            self.populate(offset, len, true);
        } else {
            self.populate_on_use(offset, len, true);
        }
    }

    /// Fills the page tables of every [`POPULATE_CHUNK`] that
    /// `[offset, offset + len)` touches and this process has not populated
    /// yet: here for writing with `write` (the caller is about to write the
    /// range; this also allocates pages the region does not have yet), on
    /// the process's populating thread for reading (a get must not cost in
    /// proportion to the object; reads that overtake it fault as usual,
    /// see [`crate::populate`]). Nothing for a mapping not populated on use
    /// or a range outside it; after the first call for a chunk, one atomic
    /// load per chunk.
    pub fn populate_on_use(&self, offset: u64, len: u64, write: bool) {
        if self.populated.is_empty() || len == 0 || !self.contains(offset, len) {
            return;
        }
        let first = offset / POPULATE_CHUNK;
        let last = (offset + len - 1) / POPULATE_CHUNK;
        for chunk in first..=last {
            let (word, bit) = ((chunk / 64) as usize, 1u64 << (chunk % 64));
            // Claimed once: only the caller that sets the bit populates.
            if self.populated[word].load(Ordering::Relaxed) & bit != 0
                || self.populated[word].fetch_or(bit, Ordering::Relaxed) & bit != 0
            {
                continue;
            }
            let start = chunk * POPULATE_CHUNK;
            let n = POPULATE_CHUNK.min(self.len() - start);
            if write {
                self.populate(start, n, true);
            } else {
                populate_for_reading(&self.map, start as usize, n as usize);
            }
        }
    }

    /// The start of this process's mapping: an offset from the daemon (of this mapping's
    /// node) is added to it, after a bounds check ([`Mapping::holds`]).
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Bytes mapped: the region's length as the Welcome or the cluster file gave it.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether nothing is mapped (a zero-length region).
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The generation of the region file this maps (see
    /// [`Region::create_shared`]): which incarnation of its node wrote it.
    /// 0 for a region received as a descriptor or anonymous memory.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Maps another node's region by path, read-only (PROT_READ): a reader
    /// never writes a peer's memory, so it never holds dirty lines of it.
    /// The file must be at least `len` bytes.
    pub fn map_path_readonly(path: &Path, len: u64) -> Result<Self> {
        let file = File::open(path)
            .map_err(|e| ShoalError::io(&format!("open peer region {}", path.display()), e))?;
        let actual = file
            .metadata()
            .map_err(|e| ShoalError::io("stat peer region", e))?
            .len();
        if actual < len && file.metadata().is_ok_and(|m| m.file_type().is_file()) {
            return Err(ShoalError::invalid(format!(
                "peer region {} is {actual} bytes, the cluster file says {len}",
                path.display()
            )));
        }
        // Populated like our own region: cluster daemons keep theirs resident,
        // so this only fills page tables and later reads take no faults.
        let map = MmapOptions::new()
            .len(usize::try_from(len).map_err(|_| ShoalError::invalid("region too large"))?)
            .populate()
            .map_raw_read_only(&file)
            .map_err(|e| ShoalError::io(&format!("mmap peer region {}", path.display()), e))?;
        let generation = read_generation(&file, len);
        Ok(Self {
            map: Arc::new(map),
            generation,
            populated: Box::default(),
        })
    }

    /// Maps another node's region by path, writable: for objects this client
    /// allocated there (remote allocation) and writes before sealing.
    ///
    /// Populated like the read-only peer mapping and the client's own region:
    /// the peer keeps its region resident, so this only fills page tables
    /// (about 0.1 s per GiB, once per peer and process). Unpopulated, every
    /// 4 KiB page of a remote object took a minor fault on its first write
    /// (262,144 for 1 GiB), which made a first remote write 5× slower than a
    /// local one (bench/table55.py).
    pub fn map_path_writable(path: &Path, len: u64) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| ShoalError::io(&format!("open peer region {}", path.display()), e))?;
        let map = MmapOptions::new()
            .len(usize::try_from(len).map_err(|_| ShoalError::invalid("region too large"))?)
            .populate()
            .map_raw(&file)
            .map_err(|e| ShoalError::io(&format!("mmap peer region {}", path.display()), e))?;
        let generation = read_generation(&file, len);
        Ok(Self {
            map: Arc::new(map),
            generation,
            populated: Box::default(),
        })
    }

    /// Private anonymous memory of `len` bytes (untouched pages cost
    /// nothing): the per-process "cache" of a region when a non-coherent
    /// fabric is simulated.
    pub fn anonymous(len: u64) -> Result<Self> {
        let map = MmapOptions::new()
            .len(usize::try_from(len).map_err(|_| ShoalError::invalid("region too large"))?)
            .map_anon()
            .map_err(|e| ShoalError::io("mmap a simulated cache", e))?;
        Ok(Self {
            map: Arc::new(MmapRaw::from(map)),
            generation: 0,
            populated: Box::default(),
        })
    }

    /// Whether an object's data and metadata lie inside the mapping.
    pub fn holds(&self, location: &crate::location::ObjectLocation) -> bool {
        self.contains(location.offset, location.size())
    }

    /// Whether `[offset, offset + len)` lies inside the mapping.
    pub fn contains(&self, offset: u64, len: u64) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len())
    }

    /// Faults in a range so later reads and writes take no page faults.
    pub fn populate(&self, offset: u64, len: u64, write: bool) {
        if len == 0 || !self.contains(offset, len) {
            return;
        }
        // SAFETY: bounds checked above; the mapping is writable.
        unsafe { populate(self.base().add(offset as usize), len as usize, write) }
    }
}

// SAFETY: the mapping is plain shared memory; synchronisation of the bytes is
// the object protocol's job (write before seal, read after), not the pointer's.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: shared references hand out only the pointer.
unsafe impl Sync for Mapping {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::populate::tests::minor_faults;

    #[test]
    fn create_map_share_and_unlink() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("region");
        let region = Region::create(&path, 1 << 20).unwrap();
        assert_eq!(region.prefault(1 << 16, || true), 1 << 20);
        let client = Mapping::map(region.fd(), region.len(), true).unwrap();
        // SAFETY: both mappings are 1 MiB long.
        unsafe {
            *client.base().add(4096) = 42;
            assert_eq!(*region.base().add(4096), 42);
        }
        assert!(client.contains(0, 1 << 20));
        assert!(!client.contains(1, 1 << 20));
        assert!(!client.contains(u64::MAX, 2));
        assert!(
            !path.exists(),
            "the name is gone as soon as the region is mapped"
        );
        drop(region);
    }

    #[test]
    fn a_path_that_exists_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("region");
        std::fs::write(&path, b"another daemon's region").unwrap();
        let err = Region::create(&path, 1 << 20)
            .err()
            .expect("the path exists");
        assert_eq!(err.kind(), crate::ErrorKind::Io, "{err}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"another daemon's region",
            "a refused create leaves the file that was there"
        );
        // A create that fails after making its file (length 0) leaves none.
        let fresh = dir.path().join("fresh");
        assert!(Region::create(&fresh, 0).is_err());
        assert!(!fresh.exists());
    }

    #[test]
    fn peer_mappings_are_populated_so_first_touches_take_no_faults() {
        // Shared memory, like cluster regions (a disk file would write-fault
        // for dirty tracking however it was mapped).
        let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
            return;
        };
        let path = dir.path().join("peer");
        let len: u64 = 8 << 20;
        let region = Region::create_shared(&path, len, 1).unwrap();
        assert_eq!(region.prefault(1 << 20, || true), len);
        let pages = len as usize / page_size();
        let writable = Mapping::map_path_writable(&path, len).unwrap();
        let before = minor_faults();
        for page in 0..pages {
            // SAFETY: inside the writable mapping.
            unsafe { writable.base().add(page * page_size()).write_volatile(7) };
        }
        let faults = minor_faults() - before;
        assert!(faults < 16, "{faults} faults writing {pages} pages");
        let readonly = Mapping::map_path_readonly(&path, len).unwrap();
        let before = minor_faults();
        let mut sum = 0u64;
        for page in 0..pages {
            // SAFETY: inside the read-only mapping.
            sum += u64::from(unsafe { readonly.base().add(page * page_size()).read_volatile() });
        }
        let faults = minor_faults() - before;
        assert_eq!(sum, 7 * pages as u64);
        assert!(faults < 16, "{faults} faults reading {pages} pages");
    }

    #[test]
    fn a_shared_region_names_its_generation_and_a_restart_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("node");
        let first = Region::create_shared(&path, 1 << 16, 7).unwrap();
        assert_eq!(first.path(), path);
        assert_eq!(
            first.len(),
            1 << 16,
            "the trailer is not part of the region"
        );
        let old = Mapping::map_path_readonly(&path, 1 << 16).unwrap();
        assert_eq!(old.generation(), 7);
        // SAFETY: inside both 64 KiB mappings.
        unsafe { *first.base().add(100) = 1 };
        // The node restarts (its daemon died: the old region is not dropped).
        std::mem::forget(first);
        let second = Region::create_shared(&path, 1 << 16, 9).unwrap();
        // SAFETY: as above.
        unsafe { *second.base().add(100) = 2 };
        let new = Mapping::map_path_writable(&path, 1 << 16).unwrap();
        assert_eq!(new.generation(), 9);
        assert_eq!(file_generation(&path, 1 << 16).unwrap(), 9);
        // SAFETY: as above. The old mapping still shows the old file.
        unsafe {
            assert_eq!(*old.base().add(100), 1);
            assert_eq!(*new.base().add(100), 2);
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
        drop(second);
        assert!(!path.exists());
        assert_eq!(Mapping::anonymous(4096).unwrap().generation(), 0);
    }

    /// A region in /dev/shm (tmpfs, like the default), or None where there
    /// is none.
    fn shm_region(len: u64) -> Option<(tempfile::TempDir, Region)> {
        let dir = tempfile::tempdir_in("/dev/shm").ok()?;
        let region = Region::create(&dir.path().join("region"), len).unwrap();
        Some((dir, region))
    }

    #[test]
    fn prefault_stops_at_the_limit_it_is_given() {
        let Some((_dir, region)) = shm_region(8 << 20) else {
            eprintln!("skipped: no /dev/shm here");
            return;
        };
        // A limit inside a chunk populates that chunk whole, nothing after.
        let done = region.prefault_up_to(2 << 20, || (3 << 20) + 1);
        assert_eq!(done, 4 << 20);
        assert_eq!(region.resident_bytes().unwrap(), 4 << 20);
        assert_eq!(region.prefault_up_to(2 << 20, || 0), 0, "0 stops at once");
        assert_eq!(region.prefault(2 << 20, || true), 8 << 20);
        assert_eq!(region.resident_bytes().unwrap(), 8 << 20);
    }

    #[test]
    fn released_pages_go_back_to_the_kernel_and_read_as_zeros() {
        let Some((_dir, region)) = shm_region(4 << 20) else {
            eprintln!("skipped: no /dev/shm here");
            return;
        };
        assert_eq!(region.resident_bytes().unwrap(), 0, "nothing allocated yet");
        region.prefault(1 << 20, || true);
        assert_eq!(region.resident_bytes().unwrap(), 4 << 20);
        let client = Mapping::map(region.fd(), region.len(), true).unwrap();
        // SAFETY: inside both 4 MiB mappings.
        unsafe { std::ptr::write_bytes(region.base(), 0xAB, 4 << 20) };

        // [1 MiB + 100, 3 MiB + 100): the whole pages inside, 2 MiB - 4 KiB.
        let page = page_size() as u64;
        let released = region.release_pages((1 << 20) + 100, 2 << 20).unwrap();
        assert_eq!(released, (2 << 20) - page);
        assert_eq!(region.resident_bytes().unwrap(), (4 << 20) - released);
        // SAFETY: inside the client's mapping.
        let byte = |at: u64| unsafe { *client.base().add(at as usize) };
        assert_eq!(byte((1 << 20) + 100), 0xAB, "the partial first page stays");
        assert_eq!(
            byte((1 << 20) + page),
            0,
            "released: zeros, in every mapping"
        );
        assert_eq!(byte((3 << 20) - 1), 0);
        assert_eq!(byte(3 << 20), 0xAB, "past the range");
        assert_eq!(byte(0), 0xAB);

        // Written again, a released page is allocated afresh.
        // SAFETY: inside the client's mapping.
        unsafe { *client.base().add(2 << 20) = 7 };
        let regrown = region.resident_bytes().unwrap() - ((4 << 20) - released);
        // (The kernel may allocate a neighbouring page or a few with it.)
        assert!(
            (page..=16 * page).contains(&regrown),
            "{regrown} bytes regrown"
        );
        // SAFETY: inside the daemon's mapping.
        assert_eq!(unsafe { *region.base().add(2 << 20) }, 7);

        assert_eq!(region.release_pages(10, 100).unwrap(), 0, "no whole page");
        assert!(region.release_pages(4 << 20, 1).is_err(), "outside");
        assert!(region.release_pages(u64::MAX, 2).is_err(), "overflow");
    }

    #[test]
    fn allocated_pages_fill_holes_and_leave_every_written_byte_alone() {
        let Some((_dir, region)) = shm_region(4 << 20) else {
            eprintln!("skipped: no /dev/shm here");
            return;
        };
        let page = page_size() as u64;
        // SAFETY: inside the 4 MiB mapping.
        unsafe { std::ptr::write_bytes(region.base().add(1 << 20), 0xCD, 1 << 20) };
        let written = region.resident_bytes().unwrap();
        assert!(written >= 1 << 20, "{written}");

        // [100, 3 MiB + 100): the whole pages inside, over the written MiB.
        let allocated = region.allocate_pages(100, 3 << 20).unwrap();
        assert_eq!(allocated, (3 << 20) - page);
        assert_eq!(region.resident_bytes().unwrap(), (3 << 20) - page);
        // SAFETY: inside the mapping.
        let byte = |at: u64| unsafe { *region.base().add(at as usize) };
        assert_eq!(byte(1 << 20), 0xCD, "written bytes stay");
        assert_eq!(byte((2 << 20) - 1), 0xCD);
        assert_eq!(byte(page), 0, "a filled hole reads zeros");
        assert_eq!(byte(2 << 20), 0);

        // Allocating again changes nothing; a release undoes it.
        region.allocate_pages(0, 3 << 20).unwrap();
        assert_eq!(region.resident_bytes().unwrap(), 3 << 20);
        region.release_pages(0, 4 << 20).unwrap();
        assert_eq!(region.resident_bytes().unwrap(), 0);

        assert_eq!(region.allocate_pages(10, 100).unwrap(), 0, "no whole page");
        assert!(region.allocate_pages(4 << 20, 1).is_err(), "outside");
        assert!(region.allocate_pages(u64::MAX, 2).is_err(), "overflow");
        assert_eq!(
            region.resident_bytes().unwrap(),
            0,
            "a refusal allocates nothing"
        );
    }

    #[test]
    fn a_client_populates_each_chunk_once_on_first_use_then_takes_no_faults() {
        let len = 3 * POPULATE_CHUNK + 4096;
        let Some((_dir, region)) = shm_region(len) else {
            eprintln!("skipped: no /dev/shm here");
            return;
        };
        region.prefault(1 << 20, || true);
        let client = Mapping::map(region.fd(), region.len(), true).unwrap();
        let pages = |from: u64, to: u64| (from..to).step_by(page_size());
        // An object across the first two chunks' border, and one in the
        // short last chunk.
        client.populate_on_use(POPULATE_CHUNK - 10, 20, false);
        client.populate_on_use(3 * POPULATE_CHUNK + 8, 100, true);
        // Reading ranges are populated by the process's populating thread.
        crate::populate::settle();
        let before = minor_faults();
        let mut sum = 0u64;
        for at in pages(0, 2 * POPULATE_CHUNK).chain(pages(3 * POPULATE_CHUNK, len)) {
            // SAFETY: inside the client's mapping.
            sum += u64::from(unsafe { client.base().add(at as usize).read_volatile() });
        }
        let faults = minor_faults() - before;
        assert_eq!(sum, 0);
        assert!(faults < 8, "{faults} faults in populated chunks");
        // The third chunk was never used: its pages fault on first touch.
        let before = minor_faults();
        for at in pages(2 * POPULATE_CHUNK, 3 * POPULATE_CHUNK) {
            // SAFETY: inside the client's mapping.
            sum += u64::from(unsafe { client.base().add(at as usize).read_volatile() });
        }
        assert!(minor_faults() - before > 8, "an unpopulated chunk faults");
        assert_eq!(sum, 0);
        // Out of range, empty, or a mapping not populated on use: nothing.
        client.populate_on_use(len, 1, false);
        client.populate_on_use(0, 0, false);
        Mapping::map(region.fd(), region.len(), false)
            .unwrap()
            .populate_on_use(0, len, false);
    }

    #[test]
    fn a_range_populated_for_writing_takes_no_faults_whether_chunks_are_tracked_or_not() {
        let len = 2 * POPULATE_CHUNK;
        let Some((_dir, region)) = shm_region(len) else {
            eprintln!("skipped: no /dev/shm here");
            return;
        };
        region.prefault(1 << 20, || true);
        let write_all = |map: &Mapping, from: u64, to: u64| {
            let before = minor_faults();
            for at in (from..to).step_by(page_size()) {
                // SAFETY: inside the mapping, which is writable.
                unsafe { map.base().add(at as usize).write_volatile(1) };
            }
            minor_faults() - before
        };
        for tracked in [true, false] {
            let map = Mapping::map(region.fd(), region.len(), tracked).unwrap();
            map.populate_for_writing(4096, POPULATE_CHUNK + 8192);
            let faults = write_all(&map, 4096, POPULATE_CHUNK + 8192);
            assert!(faults < 8, "tracked {tracked}: {faults} write faults");
            // Outside or empty: nothing, and no panic.
            map.populate_for_writing(len, 1);
            map.populate_for_writing(0, 0);
            map.populate_for_writing(u64::MAX, 2);
        }
        // Untouched and not populated: its pages fault on the first write.
        let map = Mapping::map(region.fd(), region.len(), true).unwrap();
        assert!(write_all(&map, POPULATE_CHUNK, len) > 8);
    }

    #[test]
    fn zero_length_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Region::create(&dir.path().join("r"), 0).is_err());
    }
}
