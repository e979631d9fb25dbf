//! Errors as the peer protocol carries them: a code (the error kind's wire
//! code, 0 for success) and a message.

use shoal_cluster::proto::{Outcome, Statuses};
use shoal_core::error::{ErrorKind, Result};

/// One call's outcome.
pub(super) fn outcome(result: Result<()>) -> Outcome {
    match result {
        Ok(()) => Outcome::default(),
        Err(err) => Outcome {
            code: u32::from(err.kind().code()),
            message: err.message().to_owned(),
        },
    }
}

/// One status per id.
pub(super) fn statuses(errors: Vec<Option<ErrorKind>>) -> Statuses {
    Statuses {
        codes: errors
            .into_iter()
            .map(|e| e.map_or(0, |k| u32::from(k.code())))
            .collect(),
    }
}
