//! The view epoch on the wire: every peer call carries its sender's epoch
//! (`x-shoal-epoch`), so that no node acts on a view older than one its peer
//! has seen (docs/cluster.md, "Membership").
//!
//! - A call from a node behind the callee is refused: the caller waits for
//!   its membership to bring the newer view, then asks again (the node it
//!   asks may differ: an id's home may have moved).
//! - A call to a node behind the caller is refused too: the callee's view
//!   arrives within milliseconds, the caller asks again after a short wait.
//!
//! Only the calls on a home's directory carry it ([`carries_epoch`]): what
//! they mean depends on which node is an id's home, which the view decides.
//! A call on an owner's objects (acquire, release, allocate, seal, …) means
//! the same under every view, and heartbeats must not wait for views to
//! agree. The command line's calls carry none; a call without the header is
//! not checked. A static cluster file has one view (epoch 0) for its whole
//! life, so its calls are never refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tonic::metadata::AsciiMetadataValue;
use tonic::Status;

/// The metadata key of the sender's epoch.
pub const EPOCH_HEADER: &str = "x-shoal-epoch";
/// On heartbeats: whether the sender is in touch with the membership
/// service (`up` or `down`), so a node cut off from it alone can tell.
pub const LINK_HEADER: &str = "x-shoal-membership";
/// On a refusal: which side is behind (`caller` or `callee`).
pub const BEHIND_HEADER: &str = "x-shoal-behind";

/// The peer methods whose meaning depends on the view: the home
/// directory's.
pub const DIRECTORY_METHODS: [&str; 7] = [
    "Register",
    "Unregister",
    "Publish",
    "Lookup",
    "Restore",
    "Restored",
    "Cached",
];

/// Whether a call of `method` carries the sender's epoch.
pub fn carries_epoch(method: &str) -> bool {
    DIRECTORY_METHODS.contains(&method)
}

/// This node's current view epoch, shared by its peer calls in both
/// directions and by whoever waits for it to rise; only ever raised. Also
/// whether the node is in touch with the membership service (its lease
/// renewed within its TTL), which its heartbeats tell its peers.
#[derive(Debug, Clone)]
pub struct Epoch {
    epoch: Arc<watch::Sender<u64>>,
    in_touch: Arc<AtomicBool>,
}

impl Default for Epoch {
    fn default() -> Self {
        Self {
            epoch: Arc::new(watch::channel(0).0),
            in_touch: Arc::new(AtomicBool::new(true)),
        }
    }
}

impl Epoch {
    pub fn get(&self) -> u64 {
        *self.epoch.borrow()
    }

    /// Whether this node is in touch with its membership service (always,
    /// for a static cluster file).
    pub fn in_touch(&self) -> bool {
        self.in_touch.load(Ordering::Relaxed)
    }

    pub fn set_in_touch(&self, in_touch: bool) {
        self.in_touch.store(in_touch, Ordering::Relaxed);
    }

    /// Raises the epoch to `epoch` (a lower one is ignored).
    pub fn raise(&self, epoch: u64) {
        self.epoch.send_if_modified(|now| {
            let higher = epoch > *now;
            if higher {
                *now = epoch;
            }
            higher
        });
    }

    /// Waits until the epoch is at least `epoch`, at most `within`; whether it is.
    pub async fn reach(&self, epoch: u64, within: Duration) -> bool {
        let mut changes = self.epoch.subscribe();
        let reached = tokio::time::timeout(within, changes.wait_for(|now| *now >= epoch)).await;
        matches!(reached, Ok(Ok(_)))
    }
}

/// Which side of a refused call is behind, and the epoch the other side is at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behind {
    /// The caller's view is older than the callee's, which is at this epoch.
    Caller(u64),
    /// The callee's view is older than the caller's; the callee is at this epoch.
    Callee(u64),
}

/// The callee's check of a call's epoch against its own (`mine`).
pub fn check(mine: u64, caller: u64) -> Result<(), Status> {
    if caller == mine {
        return Ok(());
    }
    let (side, message) = if caller < mine {
        (
            "caller",
            format!("stale view: the caller is at epoch {caller}, this node at {mine}"),
        )
    } else {
        (
            "callee",
            format!("this node's view is behind: epoch {mine}, the caller's {caller}"),
        )
    };
    let mut status = Status::failed_precondition(message);
    status
        .metadata_mut()
        .insert(EPOCH_HEADER, AsciiMetadataValue::from(mine));
    status
        .metadata_mut()
        .insert(BEHIND_HEADER, AsciiMetadataValue::from_static(side));
    Err(status)
}

/// What a heartbeat says of its sender's link to the membership service
/// (`None`: it says nothing, as a static file's nodes).
pub fn link_of(metadata: &tonic::metadata::MetadataMap) -> Option<bool> {
    match metadata.get(LINK_HEADER)?.to_str().ok()? {
        "up" => Some(true),
        "down" => Some(false),
        _ => None,
    }
}

/// What a refused call says about epochs; `None` for any other failure.
pub fn refusal(status: &Status) -> Option<Behind> {
    if status.code() != tonic::Code::FailedPrecondition {
        return None;
    }
    let metadata = status.metadata();
    let theirs: u64 = metadata.get(EPOCH_HEADER)?.to_str().ok()?.parse().ok()?;
    match metadata.get(BEHIND_HEADER)?.to_str().ok()? {
        "caller" => Some(Behind::Caller(theirs)),
        "callee" => Some(Behind::Callee(theirs)),
        _ => None,
    }
}

/// The epoch a call carries, if any (`None`: not checked); a header that is
/// not a number is refused.
pub fn of_call(metadata: &tonic::metadata::MetadataMap) -> Result<Option<u64>, Status> {
    let Some(value) = metadata.get(EPOCH_HEADER) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Some)
        .ok_or_else(|| Status::invalid_argument(format!("bad {EPOCH_HEADER}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_epochs_pass_and_either_side_behind_is_told_apart() {
        assert!(check(4, 4).is_ok());
        let stale = check(5, 4).unwrap_err();
        assert_eq!(refusal(&stale), Some(Behind::Caller(5)));
        let ahead = check(5, 7).unwrap_err();
        assert_eq!(refusal(&ahead), Some(Behind::Callee(5)));
        assert_eq!(refusal(&Status::failed_precondition("other")), None);
        assert_eq!(refusal(&Status::unavailable("down")), None);
    }

    #[test]
    fn the_epoch_only_rises_and_waiters_see_it() {
        let epoch = Epoch::default();
        epoch.raise(3);
        epoch.raise(2);
        assert_eq!(epoch.get(), 3);
        assert_eq!(epoch.clone().get(), 3);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            assert!(epoch.reach(3, Duration::ZERO).await);
            assert!(!epoch.reach(4, Duration::from_millis(10)).await);
            let raiser = epoch.clone();
            let waiting = tokio::spawn(async move { raiser.raise(5) });
            assert!(epoch.reach(5, Duration::from_secs(5)).await);
            waiting.await.unwrap();
        });
    }

    #[test]
    fn only_directory_calls_carry_the_epoch() {
        for method in DIRECTORY_METHODS {
            assert!(carries_epoch(method));
        }
        for method in ["Heartbeat", "Acquire", "Release", "Allocate", "Seal"] {
            assert!(!carries_epoch(method), "{method}");
        }
    }

    #[test]
    fn a_call_without_the_header_is_not_checked_and_a_bad_one_is_refused() {
        let mut metadata = tonic::metadata::MetadataMap::new();
        assert_eq!(of_call(&metadata).unwrap(), None);
        metadata.insert(EPOCH_HEADER, AsciiMetadataValue::from(9u64));
        assert_eq!(of_call(&metadata).unwrap(), Some(9));
        metadata.insert(EPOCH_HEADER, AsciiMetadataValue::from_static("x"));
        assert!(of_call(&metadata).is_err());
    }
}
