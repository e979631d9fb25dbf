//! Daemon logs in a test's output.

/// Daemon logs in the test's output, at warn (`SHOAL_LOG=debug` shows what
/// the daemons do). Once per process; later calls change nothing.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SHOAL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}
