//! What is on the tier, found by walking its directories: the walk at open
//! (in the background, then the count of sizes), what it found kept for
//! recovery's first `list` and `sweep`, and the sweep of what is nobody's
//! (temp files, stray names, unfinished or emptied segments, superseded
//! packed copies).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use shoal_core::error::Result;
use shoal_core::ids::ObjectId;

use super::io::{io_error, sync_dir};
use super::tier::{AtOpen, Found, Inner, OBJECTS, TMP};

/// Threads that walk the fan-out directories at open.
const WALKERS: usize = 4;

impl Inner {
    /// The walk at open, then the count of the sizes of what it found: the
    /// body of the thread `DirTier::open` starts.
    pub(super) fn walk_and_count(&self) {
        let walked = self.walk_at_open();
        let (ids, packed) = match walked {
            Ok(AtOpen {
                files,
                packed_ids,
                packed,
                strays,
                superseded,
            }) => {
                let mut found = self.found.0.lock().unwrap_or_else(|e| e.into_inner());
                let mut all = files.clone();
                all.extend(packed_ids);
                found.ids = Some(all);
                found.strays = Some(strays);
                found.superseded = superseded;
                found.walked = Some(Ok(()));
                (files, packed)
            }
            Err(err) => {
                self.found
                    .0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .walked = Some(Err(err));
                (Vec::new(), (0, 0))
            }
        };
        self.found.1.notify_all();
        // The count is a stat per image: let a starting daemon's own
        // work go first (this thread's priority only; it ends here).
        // SAFETY: plain system calls on this thread's own id.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
        }
        let (mut used, mut objects) = packed;
        for id in &ids {
            if let Ok(meta) = fs::metadata(self.path_of(id)) {
                used += meta.len();
                objects += 1;
            }
        }
        self.used.fetch_add(used, Ordering::AcqRel);
        self.objects.fetch_add(objects, Ordering::Relaxed);
        let (done, changed) = &self.counted;
        *done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        changed.notify_all();
    }

    /// The ids of the images under `objects/`, and the paths there that are
    /// no object's. The 256 fan-out directories are listed by a few threads.
    fn walk(&self) -> Result<(Vec<ObjectId>, Vec<PathBuf>)> {
        let parts: Vec<Result<(Vec<ObjectId>, Vec<PathBuf>)>> = std::thread::scope(|scope| {
            let walkers: Vec<_> = (0..WALKERS)
                .map(|first| {
                    scope.spawn(move || {
                        let (mut ids, mut strays) = (Vec::new(), Vec::new());
                        for fan in (first..256).step_by(WALKERS) {
                            self.walk_fan(fan as u8, &mut ids, &mut strays)?;
                        }
                        Ok((ids, strays))
                    })
                })
                .collect();
            walkers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let (mut ids, mut strays) = (Vec::new(), Vec::new());
        for part in parts {
            let (i, s) = part?;
            ids.extend(i);
            strays.extend(s);
        }
        Ok((ids, strays))
    }

    fn walk_fan(&self, fan: u8, ids: &mut Vec<ObjectId>, strays: &mut Vec<PathBuf>) -> Result<()> {
        let dir = self.root.join(OBJECTS).join(format!("{fan:02x}"));
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_error(&format!("list {}", dir.display()), e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| io_error(&format!("list {}", dir.display()), e))?;
            match id_in_fan(&entry.file_name(), fan) {
                Some(id) => ids.push(id),
                None => strays.push(entry.path()),
            }
        }
        Ok(())
    }

    /// The walk at open: the file images, then the segments (a file image
    /// wins over packed copies of the same id).
    fn walk_at_open(&self) -> Result<AtOpen> {
        let (files, mut strays) = self.walk()?;
        let loaded = self.segments.load()?;
        strays.extend(loaded.strays);
        let mut superseded = loaded.superseded;
        for id in &files {
            if let Some(slot) = self.segments.supersede(id) {
                superseded.push((slot.seq, *id));
            }
        }
        let packed_ids = self.segments.ids();
        let packed = (loaded.bytes, packed_ids.len() as u64);
        Ok(AtOpen {
            files,
            packed_ids,
            packed,
            strays,
            superseded,
        })
    }

    /// Waits for the walk at open; `Err` if it failed.
    pub(super) fn walked(&self) -> Result<std::sync::MutexGuard<'_, Found>> {
        let (found, done) = &self.found;
        let mut found = found.lock().unwrap_or_else(|e| e.into_inner());
        while found.walked.is_none() {
            found = done.wait(found).unwrap_or_else(|e| e.into_inner());
        }
        match &found.walked {
            Some(Err(err)) => Err(err.clone()),
            _ => Ok(found),
        }
    }

    /// Notes an image placed or removed, for a `list` that has not run yet.
    pub(super) fn changed(&self, id: ObjectId, placed: bool) {
        let mut found = self.found.0.lock().unwrap_or_else(|e| e.into_inner());
        if found.walked.is_none() || found.ids.is_some() {
            found.since.push((id, placed));
        }
    }

    /// The ids of every image: the walk at open's (plus what changed since)
    /// the first time, a new walk after.
    pub(super) fn list(&self) -> Result<Vec<ObjectId>> {
        let kept = {
            let mut found = self.walked()?;
            found
                .ids
                .take()
                .map(|ids| (ids, std::mem::take(&mut found.since)))
        };
        let Some((ids, since)) = kept else {
            let mut ids = self.walk()?.0;
            ids.extend(self.segments.ids());
            return Ok(ids);
        };
        if since.is_empty() {
            return Ok(ids);
        }
        let mut set: std::collections::HashSet<ObjectId> = ids.into_iter().collect();
        for (id, placed) in since {
            if placed {
                set.insert(id);
            } else {
                set.remove(&id);
            }
        }
        Ok(set.into_iter().collect())
    }

    pub(super) fn sweep(&self) -> Result<u64> {
        let mut removed = 0;
        let tmp = self.root.join(TMP);
        for entry in
            fs::read_dir(&tmp).map_err(|e| io_error(&format!("list {}", tmp.display()), e))?
        {
            let entry = entry.map_err(|e| io_error(&format!("list {}", tmp.display()), e))?;
            remove_any(&entry.path())?;
            removed += 1;
        }
        // Names under objects/ that are not ids are nobody's objects;
        // unfinished or emptied segments are nobody's either.
        let (strays, superseded) = {
            let mut found = self.walked()?;
            let superseded = std::mem::take(&mut found.superseded);
            (found.strays.take(), superseded)
        };
        let strays = match strays {
            Some(strays) => strays,
            None => self.walk()?.1,
        };
        // A `.dead` file goes only once the removal of its segment is
        // durable: a dead record must never outlive the segment it kills.
        let (deads, others): (Vec<PathBuf>, Vec<PathBuf>) = strays
            .into_iter()
            .partition(|p| p.extension().is_some_and(|e| e == "dead"));
        for path in others {
            remove_any(&path)?;
            removed += 1;
        }
        if !deads.is_empty() {
            sync_dir(self.segments.dir())?;
        }
        for path in deads {
            remove_any(&path)?;
            removed += 1;
        }
        removed += self.bury_superseded(superseded)?;
        Ok(removed)
    }
}

/// The id named by a file in fan-out directory `fan`, if the name is one:
/// exactly as the tier writes it (lower-case hex), so a file `AB…` is never
/// taken for the id whose file is `ab…`.
fn id_in_fan(name: &std::ffi::OsStr, fan: u8) -> Option<ObjectId> {
    let name = name.to_str()?;
    ObjectId::from_hex(name).filter(|id| id.as_bytes()[0] == fan && id.to_hex() == name)
}

fn remove_any(path: &Path) -> Result<()> {
    let result = if path.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    match result {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(io_error(&format!("remove {}", path.display()), e))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_name_the_tier_writes_is_an_id() {
        let id = ObjectId([0xab; 20]);
        let name = id.to_hex();
        let fan = id.as_bytes()[0];
        assert_eq!(id_in_fan(name.as_ref(), fan), Some(id));
        assert_eq!(id_in_fan(name.as_ref(), fan + 1), None, "in another fan");
        let upper = name.to_uppercase();
        assert_eq!(id_in_fan(upper.as_ref(), fan), None, "not the tier's file");
        let signed = format!("+{}", &name[1..]);
        assert_eq!(id_in_fan(signed.as_ref(), fan), None);
    }
}
