//! The status page in a real browser: headless Chromium (Debian's
//! `chromium`, installed by scripts/setup-test-tools.sh) renders a node's
//! page of an emulated 3-node cluster with the cluster's real numbers,
//! takes a screenshot of it, and finds nothing on it that could act.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::Cluster;
use shoal_client::Client;
use shoal_core::ObjectId;
use shoal_testing::{http_get, installed};

const MIB: usize = 1 << 20;

/// Runs headless Chromium on `url` with `args` (e.g. `--dump-dom`);
/// returns its standard output.
fn chromium(profile: &Path, url: &str, args: &[&str]) -> String {
    let output = Command::new("timeout")
        .args([
            "120",
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--window-size=1000,1400", "--hide-scrollbars"])
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The text of the element with `id`, tags removed (what the page shows there).
fn text_of(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page"));
    let end = dom[start..].find("</tr>").map_or(dom.len(), |e| start + e);
    let mut text = String::new();
    let mut in_tag = true; // starts inside the opening tag
    for c in dom[start..end].chars() {
        match c {
            '<' => {
                in_tag = true;
                text.push(' ');
            }
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn chromium_renders_the_status_page_with_the_clusters_numbers() {
    if !installed("chromium") {
        eprintln!(
            "SKIPPED chromium_renders_the_status_page_with_the_clusters_numbers: \
             `chromium` is not installed (scripts/setup-test-tools.sh installs Debian's)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::up(dir.path(), 3, &format!("page{}", std::process::id()));
    // Node 0 holds 10 objects of 1 MiB, node 1 three of 2 MiB, node 2 none.
    let mut a = Client::connect(cluster.socket(0)).unwrap();
    let mut b = Client::connect(cluster.socket(1)).unwrap();
    for _ in 0..10 {
        a.put(ObjectId::random(), &vec![1u8; MIB], b"").unwrap();
    }
    for _ in 0..3 {
        b.put(ObjectId::random(), &vec![2u8; 2 * MIB], b"").unwrap();
    }
    let address = cluster.metrics(0);
    let url = format!("http://{address}/");
    // The figures arrive with each node's next snapshot (once a second).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, page) = http_get(address, "/").unwrap();
        if page.contains("<td class=\"objects\">10</td>")
            && page.contains("<td class=\"objects\">3</td>")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the page never showed the objects: {page}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let profile = dir.path().join("chromium-profile");
    let dom = chromium(&profile, &url, &["--dump-dom"]);
    assert!(dom.contains("<title>shoal node 0</title>"), "{dom}");
    assert_eq!(
        text_of(&dom, "node-0"),
        "0 up (this node) 64.00 MiB 10.00 MiB (15.6%) 10 1"
    );
    assert_eq!(
        text_of(&dom, "node-1"),
        "1 up 64.00 MiB 6.00 MiB (9.4%) 3 1"
    );
    assert_eq!(text_of(&dom, "node-2"), "2 up 64.00 MiB 0 B (0.0%) 0 0");
    assert!(text_of(&dom, "objects").contains("10"));
    assert!(dom.contains("id=\"capacity-chart\""));
    assert!(
        text_of(&dom, "op-create").contains("10"),
        "10 creates on node 0"
    );
    // Read-only: nothing in the rendered page can send anything anywhere.
    for element in [
        "<form", "<button", "<input", "<script", "<iframe", "onclick",
    ] {
        assert!(!dom.contains(element), "{element} on the page");
    }
    let links: Vec<&str> = dom
        .match_indices("href=\"")
        .map(|(i, _)| &dom[i + 6..])
        .collect();
    assert!(
        links.iter().all(|l| l.starts_with("/metrics\"")),
        "the only link is to /metrics"
    );

    let shot = dir.path().join("status.png");
    chromium(
        &profile,
        &url,
        &[&format!("--screenshot={}", shot.display())],
    );
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    // A page of tables and a chart, not a blank or an error page.
    assert!(png.len() > 20_000, "screenshot of {} bytes", png.len());
    // Looking changed nothing: the store holds what it held.
    assert_eq!(a.stats().unwrap().objects, 10);
    if let Ok(keep) = std::env::var("SHOAL_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
}
