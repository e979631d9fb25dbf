//! What an accept loop does when accept fails (out of file descriptors,
//! mostly): back off instead of spinning, and log once a second at most
//! instead of once per failed call.

use std::time::{Duration, Instant};

const FIRST_DELAY: Duration = Duration::from_millis(1);
const MAX_DELAY: Duration = Duration::from_secs(1);
const LOG_EVERY: Duration = Duration::from_secs(1);

pub(crate) struct AcceptBackoff {
    what: &'static str,
    delay: Duration,
    last_log: Option<Instant>,
    suppressed: u64,
}

impl AcceptBackoff {
    pub(crate) fn new(what: &'static str) -> Self {
        Self {
            what,
            delay: FIRST_DELAY,
            last_log: None,
            suppressed: 0,
        }
    }

    pub(crate) fn succeeded(&mut self) {
        self.delay = FIRST_DELAY;
    }

    /// Logs (rate-limited) and sleeps before the next accept.
    pub(crate) async fn failed(&mut self, err: std::io::Error) {
        if self.last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            tracing::warn!(
                %err,
                more = self.suppressed,
                backoff = ?self.delay,
                "{} accept failed",
                self.what
            );
            self.last_log = Some(Instant::now());
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(MAX_DELAY);
    }
}
