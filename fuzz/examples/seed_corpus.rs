//! Writes one valid frame of every request and reply kind into a directory,
//! as a seed corpus for libFuzzer:
//!
//! ```text
//! cargo run --example seed_corpus -- corpus/frame_decoder
//! ```

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "corpus/frame_decoder".into()),
    );
    std::fs::create_dir_all(&dir)?;
    let frames = shoal_fuzz::sample_frames();
    for (i, frame) in frames.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:02}")), frame)?;
    }
    // All requests back to back: a pipelined stream.
    let stream: Vec<u8> = shoal_fuzz::sample_requests()
        .iter()
        .flat_map(|r| {
            let mut frame = Vec::new();
            r.encode(&mut frame);
            frame
        })
        .collect();
    std::fs::write(dir.join("seed-stream"), stream)?;
    println!("wrote {} seeds to {}", frames.len() + 1, dir.display());
    Ok(())
}
