//! Object ids from Python: 20-byte `bytes`, or a `shoal.ObjectID` (and the
//! `shoal.plasma.ObjectID` subclass), read straight from its `_bytes` slot so
//! a batched get of 1000 ids does no Python-level conversion.

use pyo3::exceptions::PyTypeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};
use shoal_core::ObjectId;

/// One id argument.
pub struct PyId(pub ObjectId);

/// Ids given as one id or any iterable of ids.
pub struct PyIds(pub Vec<ObjectId>);

fn id_bytes(obj: &Bound<'_, PyAny>) -> Option<ObjectId> {
    let bytes = match obj.cast::<PyBytes>() {
        Ok(bytes) => bytes.clone(),
        Err(_) => obj
            .getattr_opt(intern!(obj.py(), "_bytes"))
            .ok()
            .flatten()?
            .cast_into::<PyBytes>()
            .ok()?,
    };
    <[u8; 20]>::try_from(bytes.as_bytes()).ok().map(ObjectId)
}

fn not_an_id(obj: &Bound<'_, PyAny>) -> PyErr {
    let shown = obj
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!("expected an ObjectID or 20 bytes, got {shown}"))
}

impl<'a, 'py> FromPyObject<'a, 'py> for PyId {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        id_bytes(&obj).map(PyId).ok_or_else(|| not_an_id(&obj))
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for PyIds {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Some(id) = id_bytes(&obj) {
            return Ok(PyIds(vec![id]));
        }
        let one = |item: Bound<'py, PyAny>| id_bytes(&item).ok_or_else(|| not_an_id(&item));
        let ids = if let Ok(list) = obj.cast::<PyList>() {
            list.iter().map(one).collect::<PyResult<_>>()?
        } else if let Ok(tuple) = obj.cast::<PyTuple>() {
            tuple.iter().map(one).collect::<PyResult<_>>()?
        } else if obj.cast::<PyBytes>().is_ok() {
            return Err(not_an_id(&obj));
        } else {
            obj.try_iter()
                .map_err(|_| not_an_id(&obj))?
                .map(|item| item.and_then(one))
                .collect::<PyResult<_>>()?
        };
        Ok(PyIds(ids))
    }
}
