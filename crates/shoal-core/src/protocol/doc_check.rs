//! docs/protocol.md says what the code speaks: its version, every opcode
//! of the request and reply tables (and no other), each one's name, and the
//! payload sizes the tables give, checked against one encoded message of
//! each kind (tests.rs's samples). The document had drifted by seven
//! versions before this test (issue 45).

use std::collections::BTreeMap;

use super::tests::{sample_replies, sample_requests};
use super::*;

const DOC: &str = include_str!("../../../../docs/protocol.md");
const SOURCE: &str = include_str!("opcodes.rs");

/// A table row of the document: opcode → (name, payload size formula).
fn doc_table(section: &str) -> BTreeMap<u16, (String, String)> {
    let start = DOC
        .find(section)
        .unwrap_or_else(|| panic!("no {section:?}"));
    let rest = &DOC[start..];
    let mut rows = BTreeMap::new();
    for line in rest.lines().skip(1) {
        if line.starts_with("## ") {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 {
            continue;
        }
        let Some(hex) = cells[1].strip_prefix("0x") else {
            continue;
        };
        let Ok(code) = u16::from_str_radix(hex, 16) else {
            continue;
        };
        // Only the summary table: a row whose size cell is a formula.
        if rows.contains_key(&code) {
            continue;
        }
        rows.insert(code, (cells[2].to_string(), cells[3].to_string()));
    }
    rows
}

/// The code's opcodes: `mod op`'s constants, read from the source.
fn code_opcodes() -> BTreeMap<u16, String> {
    let start = SOURCE.find("mod op {").expect("mod op");
    let end = start + SOURCE[start..].find('}').expect("end of mod op");
    SOURCE[start..end]
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (name, value) = rest.split_once(": u16 = 0x")?;
            let value = u16::from_str_radix(value.trim_end_matches(';'), 16).ok()?;
            Some((value, name.to_string()))
        })
        .collect()
}

/// `CLUSTER_REPLY` → `cluster`; `SetMtime` → `setmtime`.
fn normalized(name: &str) -> String {
    name.trim_end_matches("_REPLY")
        .replace('_', "")
        .to_ascii_lowercase()
}

#[test]
fn the_version_is_the_codes() {
    let want = PROTOCOL_VERSION.to_string();
    assert!(
        DOC.lines()
            .next()
            .is_some_and(|title| title.ends_with(&format!("(version {want})"))),
        "docs/protocol.md's title names another version than {want}"
    );
    for said in [
        format!("`PROTOCOL_VERSION = {want}`"),
        format!("must be `PROTOCOL_VERSION` ({want})"),
    ] {
        assert!(DOC.contains(&said), "docs/protocol.md lacks {said:?}");
    }
}

#[test]
fn the_tables_list_every_opcode_by_its_name() {
    let code = code_opcodes();
    let mut documented = doc_table("## 2. Requests");
    documented.extend(doc_table("## 3. Replies"));
    let missing: Vec<_> = code
        .iter()
        .filter(|(op, _)| !documented.contains_key(op))
        .collect();
    let extra: Vec<_> = documented
        .iter()
        .filter(|(op, _)| !code.contains_key(op))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "opcodes in the code only: {missing:?}; in docs/protocol.md only: {extra:?}"
    );
    for (op, name) in &code {
        let (doc_name, _) = &documented[op];
        assert!(
            normalized(doc_name).starts_with(&normalized(name)),
            "opcode {op:#06x} is {name} in the code, {doc_name} in docs/protocol.md"
        );
    }
}

/// Whether `len` fits the document's size formula: a number is exact;
/// `A + B·n` is A plus a whole number of B-byte elements; anything with
/// other terms (strings, nested lists) is at least A.
fn fits(formula: &str, len: usize) -> bool {
    let terms: Vec<&str> = formula.split('+').map(str::trim).collect();
    let Ok(fixed) = terms[0].parse::<usize>() else {
        return true; // no fixed part stated
    };
    match terms[1..] {
        [] => len == fixed,
        [per] if per.ends_with("·n") => match per.trim_end_matches("·n").parse::<usize>() {
            Ok(element) => len >= fixed && (len - fixed).is_multiple_of(element),
            Err(_) => len >= fixed,
        },
        _ => len >= fixed,
    }
}

#[test]
fn every_message_has_the_size_the_tables_give() {
    let mut documented = doc_table("## 2. Requests");
    documented.extend(doc_table("## 3. Replies"));
    let mut frames = Vec::new();
    for request in sample_requests() {
        let mut buf = Vec::new();
        request.encode(&mut buf);
        frames.push((format!("{request:?}"), buf));
    }
    for reply in sample_replies() {
        let mut buf = Vec::new();
        reply.encode(&mut buf);
        frames.push((format!("{reply:?}"), buf));
    }
    let mut wrong = Vec::new();
    for (what, buf) in frames {
        let header = FrameHeader::parse(&buf).unwrap().unwrap();
        let (name, formula) = &documented[&header.opcode];
        let len = buf.len() - FRAME_HEADER_LEN;
        if !fits(formula, len) {
            let what: String = what.chars().take(60).collect();
            wrong.push(format!("{name} ({formula}): {len} bytes for {what}"));
        }
    }
    assert!(wrong.is_empty(), "docs/protocol.md sizes: {wrong:#?}");
}

#[test]
fn size_formulas_are_read_as_meant() {
    assert!(fits("20", 20) && !fits("20", 21));
    assert!(fits("4 + 47·n", 4 + 2 * 47) && !fits("4 + 45·n", 4 + 47));
    assert!(fits("24 + m", 30) && !fits("24 + m", 23));
}
