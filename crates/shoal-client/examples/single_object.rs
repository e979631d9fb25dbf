//! One 1 kB object per call from Rust against a running daemon (issue 14's
//! "from Rust" numbers; bench/single_object.py measures Python):
//!
//!     cargo run --release -p shoal-client --example single_object -- SOCKET [CALLS]
//!
//! Prints p50 / p99 in µs of create + write + seal (with release), get then
//! release, and contains.

use std::time::Instant;

use shoal_client::Client;
use shoal_core::ObjectId;

fn percentiles(mut ns: Vec<u64>) -> (f64, f64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)] as f64 / 1e3;
    (at(0.5), at(0.99))
}

fn time(calls: usize, mut f: impl FnMut(usize)) -> (f64, f64) {
    for i in 0..calls / 10 {
        f(i);
    }
    let ns = (0..calls)
        .map(|i| {
            let start = Instant::now();
            f(i);
            start.elapsed().as_nanos() as u64
        })
        .collect();
    percentiles(ns)
}

fn main() -> shoal_core::error::Result<()> {
    let mut args = std::env::args().skip(1);
    let socket = args.next().expect("usage: single_object SOCKET [CALLS]");
    let calls: usize = args.next().map_or(20_000, |n| n.parse().expect("a number"));
    let mut client = Client::connect(&socket)?;
    let payload = vec![7u8; 1000];

    let ids: Vec<_> = (0..calls + calls / 10)
        .map(|_| ObjectId::random())
        .collect();
    let mut next = 0;
    let create = time(calls, |_| {
        let id = ids[next];
        next += 1;
        let location = client.create(id, 1000, 0, 0).expect("create");
        client.write(location, &payload, &[]).expect("write");
        client.seal(&[id], true).expect("seal");
    });
    let id = ids[0];
    let get = time(calls, |_| {
        client.get(&[id], 0).expect("get");
        client.release(&[id]).expect("release");
    });
    let contains = time(calls, |_| {
        client.contains(id).expect("contains");
    });
    for chunk in ids.chunks(10_000) {
        client.delete(chunk)?;
    }
    println!(
        "create + write + seal: p50 {:.2} µs, p99 {:.2} µs",
        create.0, create.1
    );
    println!(
        "get + release:         p50 {:.2} µs, p99 {:.2} µs",
        get.0, get.1
    );
    println!(
        "contains:              p50 {:.2} µs, p99 {:.2} µs",
        contains.0, contains.1
    );
    Ok(())
}
