//! Human sizes: `4GiB`, `512MiB`, `1.5G`, `1000`.

/// Parses a byte size. Binary suffixes (KiB, MiB, GiB, TiB) are powers of
/// 1024; decimal ones (kB/K, MB/M, GB/G, TB/T) powers of 1000, as users write
/// them on the command line. A bare number is bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number
        .replace('_', "")
        .parse()
        .map_err(|_| format!("not a size: {text:?}"))?;
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "m" | "mb" => 1000 * 1000,
        "g" | "gb" => 1000 * 1000 * 1000,
        "t" | "tb" => 1000u64.pow(4),
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    let bytes = number * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("size out of range: {text:?}"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes for humans with binary units.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_sizes() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1kB").unwrap(), 1000);
        assert_eq!(parse_size("1.5G").unwrap(), 1_500_000_000);
        assert_eq!(parse_size("123").unwrap(), 123);
        assert_eq!(parse_size("1_000 MB").unwrap(), 1_000_000_000);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1G").is_err());
    }

    #[test]
    fn formats() {
        assert_eq!(format_size(10), "10 B");
        assert_eq!(format_size(3 << 30), "3.00 GiB");
    }
}
