//! `Buffer`: a view of an object's bytes in store memory, exported through
//! the Python buffer protocol with no copy (`memoryview`, `numpy.frombuffer`,
//! `pyarrow.py_buffer` all see the region's address). It keeps the object
//! referenced; when the last view is gone the reference is released.

use std::ffi::c_int;
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use shoal_client::shared::ObjectRef;

#[pyclass(module = "shoal._internal", frozen)]
pub struct Buffer {
    reference: Arc<ObjectRef>,
    address: usize,
    len: usize,
    /// Metadata bytes stored right after the data.
    meta_len: usize,
    writable: bool,
}

impl Buffer {
    pub fn new(
        reference: Arc<ObjectRef>,
        address: *mut u8,
        len: usize,
        meta_len: usize,
        writable: bool,
    ) -> Self {
        Self {
            reference,
            address: address as usize,
            len,
            meta_len,
            writable,
        }
    }
}

#[pymethods]
impl Buffer {
    /// The object's id (20 bytes).
    #[getter]
    fn id(&self) -> [u8; 20] {
        self.reference.id().0
    }

    /// Address of the first byte in this process (for zero-copy checks).
    #[getter]
    fn address(&self) -> usize {
        self.address
    }

    #[getter]
    fn readonly(&self) -> bool {
        !self.writable
    }

    /// The object's metadata as a read-only buffer sharing this reference.
    fn metadata(&self) -> Buffer {
        Buffer {
            reference: self.reference.clone(),
            address: self.address + self.len,
            len: self.meta_len,
            meta_len: 0,
            writable: false,
        }
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        format!(
            "shoal.Buffer(id={}, size={}, {})",
            self.reference.id(),
            self.len,
            if self.writable {
                "writable"
            } else {
                "read-only"
            }
        )
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("null view"));
        }
        let this = slf.get();
        let readonly = c_int::from(!this.writable);
        // SAFETY: `view` is the interpreter's; the memory stays mapped and the
        // object referenced while `slf` lives, and FillInfo takes a reference
        // to `slf` for the view's lifetime.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                this.address as *mut _,
                this.len as ffi::Py_ssize_t,
                readonly,
                flags,
            )
        };
        if rc != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}
