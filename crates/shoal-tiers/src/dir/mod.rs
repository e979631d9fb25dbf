//! `DirTier`: a tier in a local or shared directory (the burst buffer on
//! NVMe, or a backing store on a parallel file system).
//!
//! ```text
//! <root>/shoal-tier.id        owner marker (identity.rs), written once
//! <root>/objects/<xx>/<id>    one image per object (format.rs); xx = the id's
//!                             first byte in hex, so no directory holds more
//!                             than 1/256 of the objects
//! <root>/segments/<seq>.seg   small objects packed together (segments.rs)
//! <root>/tmp/<id>.<nonce>     images being written; garbage after a crash
//! ```
//!
//! Objects of at most `PACK_MAX` bytes are packed into segments, a batch at a
//! time (segments.rs has their layout and rules); larger ones get a file
//! each. Write order of a file image: write it to `tmp/`, fsync it, rename
//! it to `objects/xx/<id>`, fsync `objects/xx`. A crash before the rename
//! leaves only garbage in `tmp/` (swept at start); after the directory fsync
//! the image survives. File images are written with direct I/O where the
//! file system takes it (`direct.rs`), packed ones through the page cache.
//! Blocking file I/O runs on tokio's blocking pool.
//!
//! Modules: `tier` (the `DirTier`: its state, construction, capacity
//! accounting and the `Tier` implementation, which dispatches to the rest),
//! `walk` (the walk at open, the count, `list` and `sweep`), `images` (one
//! file per object: staging, naming, reads, verifies and deletes), `packed`
//! (the tier's side of packed objects: segments staged and installed, reads,
//! deletes and compaction), `batch` (a batch of puts staged and published in
//! one fsync wave), `segments` (the segment files' layout and state),
//! `direct` (O_DIRECT image writes and restores), `bounce` (their huge-page
//! buffers), `io` (error mapping and fsync helpers). Children never import
//! this module or each other in a circle: `walk`, `images`, `packed` and
//! `batch` import `tier`, never the reverse.

mod batch;
mod bounce;
mod direct;
mod images;
mod io;
mod packed;
mod segments;
mod tier;
mod walk;

pub use tier::DirTier;
