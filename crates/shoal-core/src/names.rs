//! Object names (the POSIX view): path-like, `/`-separated, relative
//! (`results/run1/table.arrow`). A directory is a prefix that names share;
//! it has no record of its own. Checked the same way by the daemon (which
//! refuses bad names) and by clients (which refuse them before a round trip).

use crate::error::{ErrorKind, Result, ShoalError};

/// Longest component, as in most Linux file systems (NAME_MAX).
pub const MAX_COMPONENT: usize = 255;
/// Longest name, as PATH_MAX.
pub const MAX_NAME: usize = 4096;

/// Checks `name`: non-empty components of at most [`MAX_COMPONENT`] bytes,
/// none `.` or `..`, no NUL, no leading, trailing or doubled `/`, at most
/// [`MAX_NAME`] bytes in all. Too long → `NameTooLong`, otherwise bad →
/// `InvalidArgument`.
pub fn check(name: &str) -> Result<()> {
    if name.len() > MAX_NAME {
        return Err(ShoalError::new(
            ErrorKind::NameTooLong,
            format!("name of {} bytes (at most {MAX_NAME})", name.len()),
        ));
    }
    if name.is_empty() {
        return Err(ShoalError::invalid("empty name"));
    }
    if name.contains('\0') {
        return Err(ShoalError::invalid(format!("name {name:?} contains NUL")));
    }
    for component in name.split('/') {
        match component {
            "" => {
                return Err(ShoalError::invalid(format!(
                    "name {name:?} has an empty component (leading, trailing or doubled '/')"
                )))
            }
            "." | ".." => {
                return Err(ShoalError::invalid(format!(
                    "name {name:?} has a {component:?} component"
                )))
            }
            long if long.len() > MAX_COMPONENT => {
                return Err(ShoalError::new(
                    ErrorKind::NameTooLong,
                    format!(
                        "name component of {} bytes (at most {MAX_COMPONENT})",
                        long.len()
                    ),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks a prefix for listing: empty (everything) or a valid name.
pub fn check_prefix(prefix: &str) -> Result<()> {
    if prefix.is_empty() {
        Ok(())
    } else {
        check(prefix)
    }
}

/// Whether `name` lies under directory `dir` (`""` is the root).
pub fn is_under(name: &str, dir: &str) -> bool {
    dir.is_empty()
        || name
            .strip_prefix(dir)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_names_pass() {
        for name in ["a", "a/b", "results/run 1/table.arrow", ".hidden/x", "a..b"] {
            check(name).unwrap();
        }
        check(&"x".repeat(MAX_COMPONENT)).unwrap();
    }

    #[test]
    fn bad_names_are_typed() {
        for name in ["", "/a", "a/", "a//b", "./a", "a/../b", "..", "a\0b"] {
            assert_eq!(
                check(name).unwrap_err().kind(),
                ErrorKind::InvalidArgument,
                "{name:?}"
            );
        }
        let long = "x".repeat(MAX_COMPONENT + 1);
        assert_eq!(check(&long).unwrap_err().kind(), ErrorKind::NameTooLong);
        let deep = vec!["abcdefg"; MAX_NAME / 8 + 1].join("/");
        assert_eq!(check(&deep).unwrap_err().kind(), ErrorKind::NameTooLong);
    }

    #[test]
    fn under_means_a_whole_component() {
        assert!(is_under("a/b", "a"));
        assert!(is_under("a/b/c", "a/b"));
        assert!(!is_under("ab/c", "a"));
        assert!(!is_under("a", "a"));
        assert!(is_under("a", ""));
    }
}
