//! A batch of puts: file images and segments staged a few at a time (on
//! blocking threads: checksum and copy are CPU work), then published
//! together: one wave of fsyncs for every file and segment, then the
//! renames and one fsync per directory touched, so the file system commits
//! its journal for many images at once rather than once per image.

use std::fs::File;
use std::io;
use std::path::Path;

use futures_util::StreamExt;
use shoal_core::error::{Result, ShoalError};

use crate::format::ObjectHeader;
use crate::tier::PutItem;

use super::io::{in_parallel, io_error};
use super::segments::{StagedSegment, PACK_MAX};
use super::tier::{DirTier, Inner, Staged};

/// Images of a batch staged at once (each on a blocking thread).
const STAGE_PARALLEL: usize = 4;

/// A segment staged: outcomes of the items it refused, and the segment.
type SegmentStage = (Vec<Option<ShoalError>>, Option<StagedSegment>);

/// A file or directory to fsync in a publish wave.
enum Syncable<'a> {
    File(&'a File),
    Dir(&'a Path),
}

impl Syncable<'_> {
    fn sync(&self) -> io::Result<()> {
        match self {
            Self::File(file) => file.sync_all(),
            Self::Dir(dir) => File::open(dir).and_then(|d| d.sync_all()),
        }
    }
}

impl DirTier {
    /// `Tier::put_batch` of a directory tier (its doc there says how).
    pub(super) async fn put_items(&self, items: Vec<PutItem>) -> Vec<Result<ObjectHeader>> {
        let n = items.len();
        let (packed, files): (Vec<_>, Vec<_>) = items
            .into_iter()
            .enumerate()
            .partition(|(_, item)| item.sizes.payload_len() <= PACK_MAX);
        let mut out: Vec<Option<Result<ObjectHeader>>> = (0..n).map(|_| None).collect();
        let file_slots: Vec<usize> = files.iter().map(|(i, _)| *i).collect();
        let staged_files: Vec<Result<Staged>> = futures_util::stream::iter(files)
            .map(|(_, item)| self.blocking(move |inner| inner.stage(item.id, item.sizes, item.src)))
            .buffered(STAGE_PARALLEL)
            .collect()
            .await;
        let staged_segments: Vec<(Vec<usize>, Result<SegmentStage>)> =
            futures_util::stream::iter(super::segments::plan(packed))
                .map(|group| {
                    let (slots, items): (Vec<usize>, Vec<PutItem>) = group.into_iter().unzip();
                    let staged = self.blocking(move |inner| Ok(inner.stage_segment(items)));
                    async move { (slots, staged.await) }
                })
                .buffered(STAGE_PARALLEL)
                .collect()
                .await;
        // What goes on to be published, and where its outcomes go.
        let mut ready_files = Vec::new();
        let mut ready_file_slots = Vec::new();
        for (slot, staged) in file_slots.into_iter().zip(staged_files) {
            match staged {
                Ok(image) => {
                    ready_files.push(image);
                    ready_file_slots.push(slot);
                }
                Err(err) => out[slot] = Some(Err(err)),
            }
        }
        let mut ready_segments = Vec::new();
        let mut ready_segment_slots = Vec::new();
        for (slots, staged) in staged_segments {
            match staged {
                Ok((refused, segment)) => {
                    let mut kept = Vec::new();
                    for (slot, refused) in slots.into_iter().zip(refused) {
                        match refused {
                            Some(err) => out[slot] = Some(Err(err)),
                            None => kept.push(slot),
                        }
                    }
                    if let Some(segment) = segment {
                        ready_segments.push(segment);
                        ready_segment_slots.push(kept);
                    }
                }
                Err(err) => {
                    for slot in slots {
                        out[slot] = Some(Err(err.clone()));
                    }
                }
            }
        }
        let published = self
            .blocking(move |inner| Ok(inner.publish(ready_files, ready_segments)))
            .await;
        match published {
            Ok((files, segments)) => {
                for (slot, outcome) in ready_file_slots.into_iter().zip(files) {
                    out[slot] = Some(outcome);
                }
                for (slots, outcomes) in ready_segment_slots.into_iter().zip(segments) {
                    for (slot, outcome) in slots.into_iter().zip(outcomes) {
                        out[slot] = Some(outcome);
                    }
                }
            }
            // The publishing task died (a panic): report it for each image.
            Err(err) => {
                for slot in out.iter_mut().filter(|o| o.is_none()) {
                    *slot = Some(Err(err.clone()));
                }
            }
        }
        out.into_iter()
            .map(|o| o.expect("one outcome per item"))
            .collect()
    }
}

impl Inner {
    /// Second half of a put, for a whole batch at once: one wave of fsyncs
    /// (from several threads, so the file system commits its journal once
    /// for all) makes every file image and every segment durable, and the
    /// segments' directory entries with them; then the file images are
    /// renamed to their final names and each directory touched fsync'ed
    /// once. Each file image is still durable before its name is (the crash
    /// rule of a single put). Outcomes in the order given.
    fn publish(
        &self,
        files: Vec<Staged>,
        segments: Vec<StagedSegment>,
    ) -> (Vec<Result<ObjectHeader>>, Vec<Vec<Result<ObjectHeader>>>) {
        // Their write-back started when they were staged, so these mostly
        // wait for I/O in flight.
        let segments_dir = self.segments.dir().to_path_buf();
        let mut targets: Vec<Syncable<'_>> =
            files.iter().map(|f| Syncable::File(&f.file)).collect();
        targets.extend(segments.iter().map(|s| Syncable::File(s.file())));
        if !segments.is_empty() {
            targets.push(Syncable::Dir(&segments_dir));
        }
        let mut outcomes = in_parallel(&targets, Syncable::sync).into_iter();
        drop(targets);
        let synced: Vec<Result<Staged>> = files
            .into_iter()
            .zip(outcomes.by_ref())
            .map(|(image, synced)| match synced {
                Ok(()) => Ok(image),
                Err(e) => Err(self.discard(
                    &image,
                    io_error(&format!("fsync {}", image.tmp.display()), e),
                )),
            })
            .collect();
        let segment_syncs: Vec<io::Result<()>> = outcomes.by_ref().take(segments.len()).collect();
        let dir_synced = match outcomes.next() {
            Some(Err(e)) => Err(io_error(
                &format!("fsync directory {}", segments_dir.display()),
                e,
            )),
            _ => Ok(()),
        };
        let installed = segments
            .into_iter()
            .zip(segment_syncs)
            .map(|(segment, synced)| {
                let synced = synced
                    .map_err(|e| io_error("fsync a segment", e))
                    .and(dir_synced.clone());
                self.install_segment(segment, synced)
            })
            .collect();
        (self.name(synced), installed)
    }
}
