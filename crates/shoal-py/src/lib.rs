//! `shoal._internal`: the Rust side of the Python package. Only conversions
//! and Python classes live here; the API users see is `python/shoal/`.

mod buffer;
mod client;
mod errors;
mod ids;

use pyo3::prelude::*;

/// Runs the `shoal` command line (the wheel's `shoal` script lands here).
#[cfg(feature = "cli")]
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>, self_command: Vec<String>) -> i32 {
    py.detach(|| shoal_cli::run(argv, self_command))
}

/// The optional parts this extension has: "cli" (the command line inside),
/// then those of the command line ("s3", "fuse", "top", "etcd"; docs/hacking.md,
/// "Optional parts").
#[pyfunction]
fn features() -> Vec<&'static str> {
    cli_features()
}

#[cfg(feature = "cli")]
fn cli_features() -> Vec<&'static str> {
    std::iter::once("cli")
        .chain(shoal_cli::features::built())
        .collect()
}

#[cfg(not(feature = "cli"))]
fn cli_features() -> Vec<&'static str> {
    Vec::new()
}

/// The optimisation level this extension was compiled at, as cargo gave it:
/// "3" for the release build (`scripts/setup.sh`), "1" for the test command's
/// (`checks` profile).
#[pyfunction]
fn opt_level() -> &'static str {
    env!("SHOAL_OPT_LEVEL")
}

/// The socket used when none is given.
#[pyfunction]
fn default_socket() -> String {
    shoal_core::local_auth::default_socket()
        .display()
        .to_string()
}

/// Creates the directory of `socket` owner-only if missing and refuses one
/// another user could have made or could change (`shoal.PermissionDenied`).
#[pyfunction]
fn ensure_socket_dir(socket: std::path::PathBuf) -> PyResult<()> {
    shoal_core::local_auth::ensure_socket_dir(&socket).map_err(|e| errors::to_py(e.into()))
}

/// Opens the log at `path` for appending, owner-only, never through a
/// symbolic link; returns the file descriptor, which the caller owns.
#[pyfunction]
fn open_private_log(path: std::path::PathBuf) -> PyResult<i32> {
    let file =
        shoal_core::local_auth::open_private_log(&path).map_err(|e| errors::to_py(e.into()))?;
    Ok(std::os::fd::IntoRawFd::into_raw_fd(file))
}

/// The cache write-back instruction a seal uses on a non-coherent fabric on
/// this machine ("clwb", "clflushopt", "clflush", "dc civac", "dcbf" or
/// "none"), for benchmark reports.
#[pyfunction]
fn flush_instruction() -> &'static str {
    shoal_core::coherence::instruction_in_use()
}

/// Copies the bytes of `src` into the writable buffer `dst` (same length)
/// with the GIL released, streaming large copies past the caches
/// (`shoal_core::copy`): what `put` uses to fill a created object.
#[pyfunction]
fn copy_into(
    py: Python<'_>,
    dst: pyo3::buffer::PyBuffer<u8>,
    src: pyo3::buffer::PyBuffer<u8>,
) -> PyResult<()> {
    buffer::copy_into(py, &dst, &src)
}

#[pymodule]
fn _internal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::Client>()?;
    m.add_class::<client::Subscription>()?;
    m.add_class::<buffer::Buffer>()?;
    #[cfg(feature = "cli")]
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(copy_into, m)?)?;
    m.add_function(wrap_pyfunction!(default_socket, m)?)?;
    m.add_function(wrap_pyfunction!(features, m)?)?;
    m.add_function(wrap_pyfunction!(flush_instruction, m)?)?;
    m.add_function(wrap_pyfunction!(opt_level, m)?)?;
    m.add_function(wrap_pyfunction!(ensure_socket_dir, m)?)?;
    m.add_function(wrap_pyfunction!(open_private_log, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
