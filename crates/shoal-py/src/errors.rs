//! Store errors become the exception classes defined in `shoal.errors`
//! (Python owns the hierarchy so `ObjectNotFound` can also be a `KeyError`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use shoal_core::ShoalError;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

pub fn to_py(err: ShoalError) -> PyErr {
    Python::attach(|py| {
        let module = ERRORS.get_or_try_init(py, || {
            PyModule::import(py, "shoal.errors").map(Bound::unbind)
        });
        let class = module.and_then(|m| m.bind(py).getattr(err.kind().name()));
        match class {
            Ok(class) => match class.call1((err.message().to_owned(),)) {
                Ok(instance) => PyErr::from_value(instance),
                Err(e) => e,
            },
            Err(_) => pyo3::exceptions::PyRuntimeError::new_err(err.to_string()),
        }
    })
}

pub trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for Result<T, ShoalError> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
