//! `shoal._internal`: the Rust side of the Python package. Only conversions
//! and Python classes live here; the API users see is `python/shoal/`.

mod buffer;
mod client;
mod errors;
mod ids;

use pyo3::prelude::*;

/// Runs the `shoal` command line (the wheel's `shoal` script lands here).
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>, self_command: Vec<String>) -> i32 {
    py.detach(|| shoal_cli::run(argv, self_command))
}

/// The socket used when none is given.
#[pyfunction]
fn default_socket() -> String {
    shoal_cli::default_socket().display().to_string()
}

#[pymodule]
fn _internal(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::Client>()?;
    m.add_class::<client::Subscription>()?;
    m.add_class::<buffer::Buffer>()?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(default_socket, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
