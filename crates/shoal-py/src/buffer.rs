//! The buffer protocol, both ways. `Buffer`: a view of an object's bytes in
//! store memory, exported with no copy (`memoryview`, `numpy.frombuffer`,
//! `pyarrow.py_buffer` all see the region's address). It keeps the object
//! referenced; when the last view is gone the reference is released. And
//! the buffers Python exports to us: `bytes_of` (their bytes), `copy_into`.

use std::ffi::c_int;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use shoal_client::shared::ObjectView;

#[pyclass(module = "shoal._internal", frozen)]
pub struct Buffer {
    view: ObjectView,
}

impl From<ObjectView> for Buffer {
    fn from(view: ObjectView) -> Self {
        Self { view }
    }
}

#[pymethods]
impl Buffer {
    /// The object's id (20 bytes).
    #[getter]
    fn id(&self) -> [u8; 20] {
        self.view.id().0
    }

    /// Address of the first byte in this process (for zero-copy checks).
    #[getter]
    fn address(&self) -> usize {
        self.view.as_ptr() as usize
    }

    #[getter]
    fn readonly(&self) -> bool {
        !self.view.is_writable()
    }

    /// The object's metadata as a read-only buffer sharing this reference.
    fn metadata(&self) -> Buffer {
        self.view.metadata().into()
    }

    fn __len__(&self) -> usize {
        self.view.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "shoal.Buffer(id={}, size={}, {})",
            self.view.id(),
            self.view.len(),
            if self.view.is_writable() {
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
        let readonly = c_int::from(!this.view.is_writable());
        // SAFETY: `view` is the interpreter's; the memory stays mapped and the
        // object referenced while `slf` lives, and FillInfo takes a reference
        // to `slf` for the view's lifetime. A read-only view is exported
        // read-only (`readonly`): Python does not write through it.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                this.view.as_ptr().cast_mut().cast(),
                this.view.len() as ffi::Py_ssize_t,
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

/// The bytes of a C-contiguous buffer Python exports (bytes, bytearray, a
/// memoryview cast to "B"), for as long as `buffer` holds the export.
pub fn bytes_of(buffer: &PyBuffer<u8>) -> PyResult<&[u8]> {
    if !buffer.is_c_contiguous() {
        return Err(PyValueError::new_err("buffers must be C-contiguous"));
    }
    let len = buffer.len_bytes();
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: a contiguous export of `len` bytes at `buf_ptr`, kept valid by
    // `buffer` (which the slice borrows) until it is released. As with any
    // buffer handed to code that releases the GIL, the exporter's owner
    // must not resize or write it meanwhile.
    Ok(unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, len) })
}

/// Copies the bytes of `src` into the writable buffer `dst` (same length)
/// with the GIL released, streaming large copies past the caches
/// (`shoal_core::copy`).
pub fn copy_into(py: Python<'_>, dst: &PyBuffer<u8>, src: &PyBuffer<u8>) -> PyResult<()> {
    if dst.readonly() {
        return Err(PyValueError::new_err("the destination is read-only"));
    }
    if !dst.is_c_contiguous() {
        return Err(PyValueError::new_err("buffers must be C-contiguous"));
    }
    let from = bytes_of(src)?;
    if dst.len_bytes() != from.len() {
        return Err(PyValueError::new_err(format!(
            "copy of {} bytes into a buffer of {}",
            from.len(),
            dst.len_bytes()
        )));
    }
    let to = dst.buf_ptr() as usize;
    py.detach(|| {
        // SAFETY: `dst` is a writable, contiguous export of `from.len()`
        // bytes, held for the whole call; a destination distinct from the
        // source (a created object's memory).
        unsafe { shoal_core::copy::copy_to_shared(to as *mut u8, from) }
    });
    Ok(())
}
