//! `shoal top` driven in tmux: it shows an emulated cluster's real
//! figures, follows a workload as it runs, and quits on `q`.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::Cluster;
use shoal_client::Client;
use shoal_core::ObjectId;
use shoal_testing::installed;

/// A tmux server of this test's own, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .expect("run tmux")
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// The words of `node`'s row in the table (after its name): state,
/// capacity (2 words), used (2), use, objects, clients, loans, ops/s, sealed.
fn row(screen: &str, node: u32) -> Option<Vec<String>> {
    let name = format!("node {node} ");
    let line = screen
        .lines()
        .find(|l| l.trim_start_matches('│').starts_with(&name))?;
    let words: Vec<String> = line
        .trim_matches(|c| c == '│' || c == ' ')
        .split_whitespace()
        .skip(2)
        .map(str::to_owned)
        .collect();
    Some(words)
}

/// Whether some line of the screen holds `words` in a row (box borders
/// count as spaces: the two lists share their lines).
fn has_words(screen: &str, words: &[&str]) -> bool {
    screen.lines().any(|line| {
        let line = line.replace('│', " ");
        let all: Vec<&str> = line.split_whitespace().collect();
        all.windows(words.len()).any(|w| {
            w.iter()
                .zip(words)
                .all(|(have, want)| *want == "*" || have == want)
        })
    })
}

fn wait_for_screen(tmux: &Tmux, what: &str, mut done: impl FnMut(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let screen = tmux.screen();
        if done(&screen) {
            return screen;
        }
        assert!(Instant::now() < deadline, "{what}; the screen:\n{screen}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn top_shows_the_clusters_figures_live_and_quits_on_q() {
    if !installed("tmux") {
        eprintln!(
            "SKIPPED top_shows_the_clusters_figures_live_and_quits_on_q: \
             `tmux` is not installed (scripts/setup-test-tools.sh installs it)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::up(dir.path(), 3, &format!("top{}", std::process::id()));
    let tmux = Tmux {
        socket: format!("shoal-top-test-{}", std::process::id()),
    };
    let command = format!(
        "{} top --dir {}",
        env!("CARGO_BIN_EXE_shoal"),
        dir.path().display()
    );
    let started = tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "120",
        "-y",
        "30",
        &command,
    ]);
    assert!(started.status.success(), "{started:?}");
    let screen = wait_for_screen(&tmux, "three nodes up", |s| {
        s.contains("3 of 3 nodes answering") && (0..3).all(|n| row(s, n).is_some())
    });
    assert_eq!(
        row(&screen, 1).unwrap()[..5],
        ["up", "64.00", "MiB", "0", "B"]
    );

    // A workload on node 1 for a few seconds: top shows its operations
    // per second while it runs, then what it left.
    let socket = cluster.socket(1).to_owned();
    let workload = std::thread::spawn(move || {
        let mut client = Client::connect(&socket).unwrap();
        let until = Instant::now() + Duration::from_secs(4);
        let mut puts = 0;
        while Instant::now() < until {
            client
                .put(ObjectId::random(), &vec![5u8; 1 << 20], b"")
                .unwrap();
            puts += 1;
            std::thread::sleep(Duration::from_millis(200));
        }
        (client, puts)
    });
    wait_for_screen(&tmux, "node 1's operations per second", |s| {
        row(s, 1).is_some_and(|r| r.get(9).and_then(|o| o.parse::<f64>().ok()).unwrap_or(0.0) > 0.0)
    });
    // The workload's client (this process) is among the busiest, working.
    let pid = std::process::id().to_string();
    wait_for_screen(&tmux, "this process among the busiest clients", |s| {
        s.contains("busiest clients") && has_words(s, &["node", "1", &pid])
    });
    // Its 1 MiB objects are the largest, sealed, with no reference left.
    wait_for_screen(&tmux, "node 1's objects among the largest", |s| {
        s.contains("largest objects")
            && has_words(s, &["node", "1", "*", "1.00", "MiB", "sealed", "0"])
    });
    let (_client, puts) = workload.join().unwrap();
    let used = format!("{puts}.00");
    let screen = wait_for_screen(&tmux, "node 1's objects", |s| {
        row(s, 1).is_some_and(|r| r.get(6) == Some(&puts.to_string()) && r[3] == used)
    });
    let node1 = row(&screen, 1).unwrap();
    assert_eq!(node1[7], "1", "one client on node 1: {node1:?}");
    assert_eq!(row(&screen, 0).unwrap()[6], "0", "nothing on node 0");
    assert!(screen.contains("node 1 used, last"), "{screen}");

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while tmux.run(&["has-session", "-t", "top"]).status.success() {
        assert!(Instant::now() < deadline, "top did not quit on q");
        std::thread::sleep(Duration::from_millis(100));
    }
}
