//! Memory pressure stall information (PSI): the share of time tasks waited
//! for memory, from /proc/pressure/memory or a cgroup's memory.pressure.
//!
//! ```text
//! some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//! full avg10=0.00 avg60=0.00 avg300=0.00 total=0
//! ```
//! `some`: at least one task stalled; `full`: all non-idle tasks stalled.
//! avgN are percentages averaged over N seconds; `total` is cumulative
//! microseconds. A kernel without PSI (before 4.20, or booted with psi=0) has
//! no such file, or refuses to read it: that is "no signal", not an error.

use std::path::Path;

use shoal_core::error::{Result, ShoalError};

use super::error::ParseError;

pub const HOST_PRESSURE: &str = "/proc/pressure/memory";

const FILE: &str = "memory pressure";

/// One line of a PSI file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PressureLine {
    /// Percent of the last 10 s (0..=100).
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    /// Cumulative stall time in microseconds.
    pub total_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pressure {
    pub some: PressureLine,
    /// Absent from files that have no `full` line (the kernel's cpu file before 5.13).
    pub full: Option<PressureLine>,
}

/// Parses the text of a PSI file. Keys the kernel may add later are skipped.
pub fn parse_pressure(text: &str) -> Result<Pressure, ParseError> {
    let mut some = None;
    let mut full = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (target, names) = match words.next() {
            Some("some") => (&mut some, SOME_FIELDS),
            Some("full") => (&mut full, FULL_FIELDS),
            _ => continue,
        };
        *target = Some(parse_line(words, names)?);
    }
    let some = some.ok_or(ParseError::MissingField {
        file: FILE,
        field: "some",
    })?;
    Ok(Pressure { some, full })
}

/// Field names as errors report them, per line kind.
type FieldNames = [&'static str; 4];
const SOME_FIELDS: FieldNames = ["some avg10", "some avg60", "some avg300", "some total"];
const FULL_FIELDS: FieldNames = ["full avg10", "full avg60", "full avg300", "full total"];

fn parse_line<'a>(
    words: impl Iterator<Item = &'a str>,
    names: FieldNames,
) -> Result<PressureLine, ParseError> {
    let mut avgs: [Option<f64>; 3] = [None; 3];
    let mut total = None;
    for word in words {
        let Some((key, value)) = word.split_once('=') else {
            continue;
        };
        let index = match key {
            "avg10" => 0,
            "avg60" => 1,
            "avg300" => 2,
            "total" => {
                total = Some(value.parse::<u64>().map_err(|_| ParseError::BadValue {
                    file: FILE,
                    field: names[3],
                    value: value.to_string(),
                })?);
                continue;
            }
            _ => continue,
        };
        let percent = value
            .parse::<f64>()
            .ok()
            .filter(|p| p.is_finite() && (0.0..=100.0).contains(p))
            .ok_or_else(|| ParseError::BadValue {
                file: FILE,
                field: names[index],
                value: value.to_string(),
            })?;
        avgs[index] = Some(percent);
    }
    let need = |value: Option<f64>, i: usize| {
        value.ok_or(ParseError::MissingField {
            file: FILE,
            field: names[i],
        })
    };
    Ok(PressureLine {
        avg10: need(avgs[0], 0)?,
        avg60: need(avgs[1], 1)?,
        avg300: need(avgs[2], 2)?,
        total_us: total.ok_or(ParseError::MissingField {
            file: FILE,
            field: names[3],
        })?,
    })
}

/// Reads a PSI file; `None` when this kernel has no pressure information.
pub fn read_pressure(path: &Path) -> Result<Option<Pressure>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // psi=0 on the kernel command line: the file exists but reads fail.
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(None),
        Err(e) => return Err(ShoalError::io(&format!("read {}", path.display()), e)),
    };
    Ok(Some(parse_pressure(&text).map_err(|e| {
        ShoalError::io(&format!("parse {}", path.display()), e)
    })?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_some_and_full() {
        let p = parse_pressure(
            "some avg10=1.50 avg60=0.25 avg300=0.00 total=123456\n\
             full avg10=0.75 avg60=0.10 avg300=0.00 total=6543\n",
        )
        .unwrap();
        assert_eq!(p.some.avg10, 1.5);
        assert_eq!(p.some.avg60, 0.25);
        assert_eq!(p.some.total_us, 123456);
        assert_eq!(p.full.unwrap().total_us, 6543);
    }

    #[test]
    fn full_is_optional_and_unknown_keys_are_skipped() {
        let p = parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 avg900=1 total=0").unwrap();
        assert_eq!(p.full, None);
        assert_eq!(p.some.total_us, 0);
    }

    #[test]
    fn malformed_text_gives_typed_errors() {
        assert_eq!(
            parse_pressure(""),
            Err(ParseError::MissingField {
                file: FILE,
                field: "some"
            })
        );
        assert_eq!(
            parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00"),
            Err(ParseError::MissingField {
                file: FILE,
                field: "some total"
            })
        );
        assert_eq!(
            parse_pressure("some avg10=0.00 avg60=0.00 total=5"),
            Err(ParseError::MissingField {
                file: FILE,
                field: "some avg300"
            })
        );
        for (text, field) in [
            ("some avg10=x avg60=0 avg300=0 total=0", "some avg10"),
            ("some avg10=NaN avg60=0 avg300=0 total=0", "some avg10"),
            ("some avg10=0 avg60=101 avg300=0 total=0", "some avg60"),
            ("some avg10=0 avg60=0 avg300=0 total=-1", "some total"),
            (
                "some avg10=0 avg60=0 avg300=0 total=0\nfull avg10=0 avg60=0 avg300=inf total=0",
                "full avg300",
            ),
        ] {
            assert!(
                matches!(parse_pressure(text), Err(ParseError::BadValue { field: f, .. }) if f == field),
                "{text:?}"
            );
        }
    }

    #[test]
    fn an_absent_file_is_no_signal() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            read_pressure(&dir.path().join("memory.pressure")).unwrap(),
            None
        );
        let path = dir.path().join("bad");
        std::fs::write(&path, "garbage").unwrap();
        assert_eq!(
            read_pressure(&path).unwrap_err().kind(),
            shoal_core::ErrorKind::Io
        );
    }

    #[test]
    fn reads_this_hosts_pressure_if_it_has_any() {
        match read_pressure(Path::new(HOST_PRESSURE)) {
            Ok(Some(p)) => assert!(p.some.avg10 <= 100.0),
            Ok(None) => eprintln!("skipped: this kernel reports no memory pressure"),
            Err(e) => panic!("{HOST_PRESSURE} exists but does not parse: {e}"),
        }
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(text in "(?s).{0,300}") {
            let _ = parse_pressure(&text);
        }

        #[test]
        fn never_panics_on_near_miss_lines(words in prop::collection::vec("(some|full|avg10|avg60|avg300|total|=|[0-9.-]{1,6}| ){0,6}", 0..8)) {
            let _ = parse_pressure(&words.join("\n"));
        }
    }
}
