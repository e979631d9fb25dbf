//! Why a kernel memory file could not be read as expected.
//!
//! The parsers return this typed error (tests match on it); the readers fold
//! it into a `ShoalError` of kind `Io`, naming the file.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A field the controller needs is not in the file.
    #[error("{file}: no {field} field")]
    MissingField {
        file: &'static str,
        field: &'static str,
    },
    /// A field is present but its value is not a number in the expected form.
    #[error("{file}: {field} has value {value:?}, not a number")]
    BadValue {
        file: &'static str,
        field: &'static str,
        value: String,
    },
    /// A value that parses but cannot be right (a node with 0 bytes of memory).
    #[error("{file}: {field} = {value} is impossible")]
    Impossible {
        file: &'static str,
        field: &'static str,
        value: u64,
    },
}

impl From<ParseError> for shoal_core::ShoalError {
    fn from(err: ParseError) -> Self {
        shoal_core::ShoalError::io("read node memory", err)
    }
}
