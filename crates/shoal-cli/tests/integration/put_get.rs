//! `shoal put` / `shoal get`: a file's bytes round-trip through the store by
//! id and by name, and bad input (an unknown id, a malformed one, a file
//! larger than the store) fails with a clear message and leaves nothing.

use std::path::Path;
use std::process::Output;

use crate::support::shoal;
use shoal_testing::ServeProcess;

fn serve(socket: &Path) -> ServeProcess {
    let mut command = shoal();
    command
        .args(["serve", "--capacity", "64MiB", "--no-prefault", "--socket"])
        .arg(socket);
    ServeProcess::spawn(command, socket)
}

fn run(socket: &Path, args: &[&str]) -> Output {
    shoal()
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn files_round_trip_by_id_and_name_and_bad_input_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("pg.sock");
    let _daemon = serve(&socket);
    // 20 MiB + 3 bytes: several copy steps and a ragged end.
    let data: Vec<u8> = (0..(20 << 20) + 3)
        .map(|i: u32| (i * 7 % 251) as u8)
        .collect();
    let input = dir.path().join("in.bin");
    std::fs::write(&input, &data).unwrap();

    let out = run(
        &socket,
        &["put", input.to_str().unwrap(), "--name", "d/in.bin"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert_eq!(id.len(), 40, "{id}");

    let by_id = dir.path().join("by-id.bin");
    let out = run(&socket, &["get", &id, "-o", by_id.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::read(&by_id).unwrap() == data);
    let out = run(&socket, &["get", "--name", "d/in.bin"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout == data);

    // The object is sealed, named, and no reference is left behind.
    let mut client = shoal_client::Client::connect(&socket).unwrap();
    let entry = client.resolve("d/in.bin").unwrap();
    assert_eq!(entry.id.to_hex(), id);
    assert_eq!(entry.data_size, data.len() as u64);
    let listed = client.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(client.stats().unwrap().referenced, 0);

    // An explicit id; putting it again is refused (objects are immutable).
    let small = dir.path().join("small.bin");
    std::fs::write(&small, b"shoal").unwrap();
    let given = "00112233445566778899aabbccddeeff00112233";
    let out = run(&socket, &["put", small.to_str().unwrap(), "--id", given]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&socket, &["put", small.to_str().unwrap(), "--id", given]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("exists"), "{}", stderr(&out));

    // Bad input: a malformed id, an unknown one, a file larger than the store.
    let out = run(&socket, &["get", "xyz"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not an object id"),
        "{}",
        stderr(&out)
    );
    let out = run(&socket, &["get", &"ab".repeat(20)]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
    let big = dir.path().join("big.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(80 << 20)
        .unwrap();
    let out = run(
        &socket,
        &["put", big.to_str().unwrap(), "--timeout-ms", "100"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("ObjectTooLarge"), "{}", stderr(&out));
    let out = run(&socket, &["put", "/nonexistent/file"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/nonexistent/file"),
        "{}",
        stderr(&out)
    );
    // Nothing of the failures is left: the two objects put, no unsealed one.
    let stats = client.stats().unwrap();
    assert_eq!(stats.objects, 2);
    assert_eq!(stats.sealed, 2);
}
