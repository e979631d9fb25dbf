//! Errors with a kind.
//!
//! Every error the store can return carries a [`ErrorKind`]; the kind is what
//! crosses the wire (as a `u16`) and what the Python package maps to an
//! exception class. The message carries the context (id, sizes, path).

use crate::ids::ObjectId;
use crate::local_auth::error::LocalAuthError;

/// The kind of a store error, stable on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorKind {
    /// No object with this id (or it is not visible any more).
    ObjectNotFound = 1,
    /// An object with this id already exists.
    ObjectExists = 2,
    /// The operation needs a sealed object and this one is still being written.
    ObjectNotSealed = 3,
    /// The object is already sealed (seal twice, abort after seal).
    ObjectAlreadySealed = 4,
    /// The object was created by another client; only its creator may seal or abort it.
    NotOwner = 5,
    /// Not enough free memory even after evicting everything evictable.
    StoreFull = 6,
    /// The object can never fit: larger than the store's capacity.
    ObjectTooLarge = 7,
    /// A frame that does not decode: bad length, unknown opcode, truncated body.
    Protocol = 8,
    /// A request that decodes but makes no sense (zero ids, sizes that overflow).
    InvalidArgument = 9,
    /// An operating-system error (socket, mmap, file).
    Io = 10,
    /// The peer (daemon or client) went away.
    Disconnected = 11,
    /// A wait (get, create on a full store) ran out of time.
    Timeout = 12,
    /// The object is referenced and the operation needs it unreferenced.
    ObjectInUse = 13,
    /// Protocol versions differ.
    VersionMismatch = 14,
    /// Another node of the cluster did not answer (down, partitioned) within
    /// the timeout; objects on live nodes stay available.
    NodeUnavailable = 15,
    /// A local security check refused: a socket directory or log another
    /// user could have planted, or a daemon or client of another user.
    PermissionDenied = 16,
    /// A stored copy of the object failed its checksum (torn, truncated or
    /// bit-flipped tier file) and no intact copy was left to serve.
    ObjectCorrupt = 17,
    /// A name (POSIX view) with a component over 255 bytes or over 4096
    /// bytes in all; other bad names are `InvalidArgument`.
    NameTooLong = 18,
    /// A create of an id whose home node (the node that keeps its directory
    /// entry) cannot be reached or is rebuilding: the message names the node.
    /// A put that chooses its own id tries another; a caller-chosen id gets
    /// this. A kind of `NodeUnavailable` (the Python class derives from it).
    HomeUnavailable = 19,
}

impl ErrorKind {
    /// The wire code (`Error`'s `kind`, a `Statuses` entry); never 0, which means success.
    pub fn code(self) -> u16 {
        self as u16
    }

    /// The kind with wire code `code`; `None` for 0 and unknown codes, which a decoder refuses.
    pub fn from_code(code: u16) -> Option<Self> {
        use ErrorKind::*;
        Some(match code {
            1 => ObjectNotFound,
            2 => ObjectExists,
            3 => ObjectNotSealed,
            4 => ObjectAlreadySealed,
            5 => NotOwner,
            6 => StoreFull,
            7 => ObjectTooLarge,
            8 => Protocol,
            9 => InvalidArgument,
            10 => Io,
            11 => Disconnected,
            12 => Timeout,
            13 => ObjectInUse,
            14 => VersionMismatch,
            15 => NodeUnavailable,
            16 => PermissionDenied,
            17 => ObjectCorrupt,
            18 => NameTooLong,
            19 => HomeUnavailable,
            _ => return None,
        })
    }

    /// Whether this kind means another node could not be reached (a
    /// `HomeUnavailable` is one): callers that retry on `NodeUnavailable`
    /// test this.
    pub fn is_node_unavailable(self) -> bool {
        matches!(self, Self::NodeUnavailable | Self::HomeUnavailable)
    }

    /// The name Python's exception classes and messages use: the variant's, except
    /// `ProtocolError` for `Protocol` and `IoError` for `Io`.
    pub fn name(self) -> &'static str {
        use ErrorKind::*;
        match self {
            ObjectNotFound => "ObjectNotFound",
            ObjectExists => "ObjectExists",
            ObjectNotSealed => "ObjectNotSealed",
            ObjectAlreadySealed => "ObjectAlreadySealed",
            NotOwner => "NotOwner",
            StoreFull => "StoreFull",
            ObjectTooLarge => "ObjectTooLarge",
            Protocol => "ProtocolError",
            InvalidArgument => "InvalidArgument",
            Io => "IoError",
            Disconnected => "Disconnected",
            Timeout => "Timeout",
            ObjectInUse => "ObjectInUse",
            VersionMismatch => "VersionMismatch",
            NodeUnavailable => "NodeUnavailable",
            PermissionDenied => "PermissionDenied",
            ObjectCorrupt => "ObjectCorrupt",
            NameTooLong => "NameTooLong",
            HomeUnavailable => "HomeUnavailable",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A store error: a kind plus a human message with the context.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("{kind}: {message}")]
pub struct ShoalError {
    kind: ErrorKind,
    message: String,
}

impl ShoalError {
    /// An error of `kind` with a message that gives the context.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// What went wrong, as the wire and the Python package see it.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human message: the context (id, sizes, path), without the kind.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// `ObjectNotFound`, naming the id.
    pub fn not_found(id: &ObjectId) -> Self {
        Self::new(ErrorKind::ObjectNotFound, format!("object {id} not found"))
    }

    /// `ObjectExists`, naming the id.
    pub fn exists(id: &ObjectId) -> Self {
        Self::new(
            ErrorKind::ObjectExists,
            format!("object {id} already exists"),
        )
    }

    /// `Protocol`: a frame or shared-memory record that does not decode.
    pub fn protocol(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Protocol, message)
    }

    /// `InvalidArgument`: a request that decodes but makes no sense.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    /// `Io`, with what was being done (`context`) before the operating system's error.
    pub fn io(context: &str, err: impl std::fmt::Display) -> Self {
        Self::new(ErrorKind::Io, format!("{context}: {err}"))
    }
}

impl From<std::io::Error> for ShoalError {
    fn from(err: std::io::Error) -> Self {
        match err.kind() {
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionReset => {
                Self::new(ErrorKind::Disconnected, err.to_string())
            }
            _ => Self::new(ErrorKind::Io, err.to_string()),
        }
    }
}

/// A part of shoal this build leaves out: the Cargo feature that has it was
/// off (`s3`, `fuse`, `top`: docs/hacking.md, "Optional parts"). A command
/// or configuration that needs it refuses with this before it starts anything.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "{needed_for} needs the `{feature}` feature, which this build of shoal leaves out; build \
     with it: `SHOAL_FEATURES=full ./scripts/setup.sh` (the Python package; or `maturin develop \
     --release --features {feature}`), `cargo build --release -p shoal-cli` (the `shoal` \
     binary, every feature on)"
)]
pub struct MissingFeature {
    /// The Cargo feature, e.g. `s3`.
    pub feature: &'static str,
    /// What needs it, e.g. "an s3:// backing store".
    pub needed_for: String,
}

impl MissingFeature {
    /// `needed_for` needs `feature`.
    pub fn new(feature: &'static str, needed_for: impl Into<String>) -> Self {
        Self {
            feature,
            needed_for: needed_for.into(),
        }
    }
}

/// A result whose error is a [`ShoalError`] unless said otherwise.
pub type Result<T, E = ShoalError> = std::result::Result<T, E>;

// Conversions from the typed errors of modules that need none of this one
// (so the dependency runs one way: here, to them).

impl From<LocalAuthError> for ShoalError {
    fn from(err: LocalAuthError) -> Self {
        let kind = match err {
            LocalAuthError::Io { .. } | LocalAuthError::PeerCredentials(_) => ErrorKind::Io,
            _ => ErrorKind::PermissionDenied,
        };
        ShoalError::new(kind, err.to_string())
    }
}

impl From<MissingFeature> for ShoalError {
    fn from(err: MissingFeature) -> Self {
        ShoalError::invalid(err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for code in 0..100u16 {
            if let Some(kind) = ErrorKind::from_code(code) {
                assert_eq!(kind.code(), code);
            }
        }
        assert_eq!(
            ErrorKind::from_code(ErrorKind::VersionMismatch.code()),
            Some(ErrorKind::VersionMismatch)
        );
        assert_eq!(ErrorKind::from_code(0), None);
    }

    #[test]
    fn a_missing_feature_names_it_and_how_to_build_with_it() {
        let err = MissingFeature::new("fuse", "`shoal mount`");
        let text = err.to_string();
        assert!(
            text.starts_with("`shoal mount` needs the `fuse` feature"),
            "{text}"
        );
        assert!(
            text.contains("SHOAL_FEATURES=full ./scripts/setup.sh"),
            "{text}"
        );
        assert!(text.contains("--features fuse"), "{text}");
        assert!(
            text.contains("cargo build --release -p shoal-cli"),
            "{text}"
        );
        let err = ShoalError::from(err);
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert_eq!(err.message(), text);
    }
}
