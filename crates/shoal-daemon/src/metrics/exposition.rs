//! Reads the text exposition format back into samples: what the status
//! page and `shoal top` show is what a scraper sees, from one source.
//! Hand-written (a few lines): the metric crates encode, none of the
//! well-kept ones parses.

/// One line of the exposition: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample in `text`; comment lines and lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find('{') {
        Some(open) => (&line[..open], &line[open..]),
        None => line.split_once(' ')?,
    };
    let (labels, value) = if let Some(rest) = rest.strip_prefix('{') {
        let close = closing_brace(rest)?;
        (parse_labels(&rest[..close])?, rest[close + 1..].trim())
    } else {
        (Vec::new(), rest.trim())
    };
    // A timestamp may follow the value.
    let value = value.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// The index of the `}` ending a label set, skipping quoted values.
fn closing_brace(text: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_labels(text: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    let mut rest = text.trim_start_matches(',');
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.push((key.trim().to_owned(), value));
        rest = after[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_labels_and_values() {
        let text = "# TYPE a counter\na_total 3\nb{op=\"get\",le=\"+Inf\"} 2.5\nc{x=\"q\\\"}\"} +Inf\nbroken\n# EOF\n";
        let samples = parse(text);
        assert_eq!(samples.len(), 3);
        assert_eq!(samples[0].name, "a_total");
        assert_eq!(samples[0].value, 3.0);
        assert_eq!(samples[1].label("op"), Some("get"));
        assert_eq!(samples[1].label("le"), Some("+Inf"));
        assert_eq!(samples[1].value, 2.5);
        assert_eq!(samples[2].label("x"), Some("q\"}"));
        assert!(samples[2].value.is_infinite());
    }
}
