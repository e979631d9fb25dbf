//! The busiest clients and largest objects of a node, as `/top` serves them
//! (JSON) to `shoal top`. The store thread fills the view in its
//! once-a-second snapshot; the HTTP thread only reads it. Finding the
//! largest objects walks the object table, so the snapshot does it only
//! while someone reads `/top` (asked within the last [`WANTED_FOR`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Rows of each list.
pub const ROWS: usize = 5;
/// How long after a read of `/top` the snapshot keeps finding the largest objects.
pub const WANTED_FOR: Duration = Duration::from_secs(10);

/// A connected client as the busiest-clients list shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientRow {
    pub client: u32,
    /// The process id it gave (0: not said).
    pub pid: u32,
    pub connected_seconds: f64,
    pub requests: u64,
    pub requests_per_second: f64,
    pub objects_per_second: f64,
}

/// An object in memory as the largest-objects list shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectRow {
    /// 40 hex digits.
    pub id: String,
    /// Data + metadata bytes.
    pub bytes: u64,
    pub sealed: bool,
    /// References held on it.
    pub refs: u32,
}

/// What `/top` answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TopView {
    /// Unix seconds of the snapshot.
    pub at: f64,
    pub clients: Vec<ClientRow>,
    pub largest: Vec<ObjectRow>,
}

impl TopView {
    /// A view as `/top` serves it; `None` if `json` is not one.
    pub fn from_json(json: &str) -> Option<Self> {
        serde_json::from_str(json).ok()
    }
}

#[derive(Default)]
pub struct Top {
    view: Mutex<TopView>,
    /// Unix milliseconds of the last read of `/top` (0: never).
    wanted_at: AtomicU64,
}

impl Top {
    /// The view as JSON, and a note that someone is watching.
    pub fn read(&self, now_ms: u64) -> String {
        self.wanted_at.store(now_ms, Ordering::Relaxed);
        let view = self.view.lock().map(|v| v.clone()).unwrap_or_default();
        serde_json::to_string(&view).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Whether the snapshot should find the largest objects now.
    pub fn wanted(&self, now_ms: u64) -> bool {
        let at = self.wanted_at.load(Ordering::Relaxed);
        at != 0 && now_ms.saturating_sub(at) <= WANTED_FOR.as_millis() as u64
    }

    pub fn publish(&self, view: TopView) {
        if let Ok(mut slot) = self.view.lock() {
            *slot = view;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_objects_are_wanted_only_while_someone_reads_the_view() {
        let top = Top::default();
        assert!(!top.wanted(1_000));
        let empty: TopView = serde_json::from_str(&top.read(1_000)).unwrap();
        assert_eq!(empty, TopView::default());
        assert!(top.wanted(1_000 + 9_000));
        assert!(!top.wanted(1_000 + 11_000));
        let view = TopView {
            at: 2.0,
            clients: vec![ClientRow {
                client: 3,
                pid: 42,
                connected_seconds: 1.5,
                requests: 9,
                requests_per_second: 4.0,
                objects_per_second: 8.0,
            }],
            largest: vec![ObjectRow {
                id: "ab".repeat(20),
                bytes: 1 << 20,
                sealed: true,
                refs: 1,
            }],
        };
        top.publish(view.clone());
        let read: TopView = serde_json::from_str(&top.read(20_000)).unwrap();
        assert_eq!(read, view);
    }
}
