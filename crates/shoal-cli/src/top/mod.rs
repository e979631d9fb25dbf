//! `shoal top`: a live terminal view of a cluster's nodes (or of single
//! daemons), read from their `/metrics` once a second: memory, objects,
//! clients, operations and bytes sealed per second, the busiest clients and
//! the largest objects (from their `/top`), and each node's usage over the
//! last minutes as a sparkline. `q`, Esc or Ctrl-C quits.
//!
//! The terminal view is the `top` feature (ratatui, crossterm): a build
//! without it has the command, which refuses, naming the feature.

mod args;
pub use args::TopArgs;

#[cfg(feature = "top")]
mod terminal;
#[cfg(feature = "top")]
pub use terminal::run;

#[cfg(not(feature = "top"))]
mod absent {
    /// Refuses: this build has no terminal view.
    pub fn run(_args: super::args::TopArgs) -> anyhow::Result<()> {
        Err(crate::features::missing("top", "`shoal top`"))
    }
}
#[cfg(not(feature = "top"))]
pub use absent::run;
