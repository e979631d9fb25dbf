//! libFuzzer entry point: arbitrary bytes into the frame decoders.
//! The body lives in `shoal_fuzz::fuzz_frames` so the stable smoke test runs
//! exactly the same checks.

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    shoal_fuzz::fuzz_frames(data);
});
