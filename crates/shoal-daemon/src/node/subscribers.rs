//! Clients that asked to hear of seals and removals (`Subscribe`).

use std::cell::RefCell;

use shoal_core::event::ObjectEvent;
use tokio::sync::mpsc;

/// Notifications a subscriber may fall behind before it is disconnected, so a
/// subscriber that stops reading cannot grow the daemon's heap without bound.
pub const SUBSCRIBER_QUEUE: usize = 65_536;

#[derive(Default)]
pub(super) struct Subscribers {
    senders: RefCell<Vec<mpsc::Sender<ObjectEvent>>>,
}

impl Subscribers {
    pub(super) fn subscribe(&self) -> mpsc::Receiver<ObjectEvent> {
        let (sender, receiver) = mpsc::channel(SUBSCRIBER_QUEUE);
        self.senders.borrow_mut().push(sender);
        receiver
    }

    pub(super) fn send(&self, notification: &ObjectEvent) {
        self.senders
            .borrow_mut()
            .retain(|s| match s.try_send(*notification) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // Dropping the sender ends the stream once the queued
                    // notifications are out: the subscriber sees EOF.
                    tracing::warn!(
                        queued = SUBSCRIBER_QUEUE,
                        "subscriber too slow, ending its subscription"
                    );
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            });
    }
}
