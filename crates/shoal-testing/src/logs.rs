//! Daemon logs in a test's output.

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Daemon logs in the test's output, at warn (`SHOAL_LOG=debug` shows what
/// the daemons do; the `shoal` command's syntax, `debug,h2=info`). Once per
/// process; later calls change nothing.
pub fn init_logs() {
    let filter = std::env::var("SHOAL_LOG")
        .ok()
        .and_then(|text| text.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::WARN));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_test_writer())
        .try_init();
}
