//! Shutdown as a value: whoever holds a clone can stop the server, and every
//! task can wait for it.

use std::sync::Arc;
use tokio::sync::watch;

#[derive(Clone)]
pub struct Shutdown {
    sender: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    pub fn new() -> Self {
        Self {
            sender: Arc::new(watch::channel(false).0),
        }
    }

    /// Asks the server to stop; safe from any thread, any number of times.
    pub fn trigger(&self) {
        self.sender.send_replace(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.sender.borrow()
    }

    /// Resolves once [`trigger`](Self::trigger) was called.
    pub async fn wait(&self) {
        let mut receiver = self.sender.subscribe();
        let _ = receiver.wait_for(|stopped| *stopped).await;
    }
}
