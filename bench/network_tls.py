"""Peer traffic over TLS against cleartext, alternated in one run (issue 44).

    python bench/network.py --tls --out bench/results/network-tls.md

Two emulated 2-node clusters side by side, one with `cluster up --tls` (TLS 1.3 on
both peer channels, as between hosts), one in cleartext; node 1 is network-only, so a
get on node 0 pulls over node 1's data channel. In alternating order (ABBA) per round:
  pull   a 1 GiB object's first get on node 0 (the pull), beside the raw-socket limit:
         the raw loopback pair of network.py (sendfile → recv_into, 1 and 4 streams),
         and the same pair over TLS 1.3 with AES-128-GCM (OpenSSL, through Python's ssl);
  rpc    single-id gets (timeout 0) of absent ids: homed on node 1 they cost one peer
         RPC round trip (Lookup), homed on node 0 none; the round trip is the difference
         of the medians;
  first  a fresh pair of clusters per sample: the first get of a 1 MB object, whose
         data-channel connection (and, with TLS, its full handshake) is new.
Targets: pull with TLS ≥ 0.75× cleartext; RPC round trip p50 with TLS ≤ 1.2×
cleartext; first get with TLS ≤ 2× cleartext.
"""

import datetime
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
from cluster import checkout, machine_busy, own_cpu  # noqa: E402
from network import (  # noqa: E402
    GiB,
    RawPair,
    Shoal,
    on_signal,
)
from table1 import log, machine  # noqa: E402

from shoal.testing import shoal_command  # noqa: E402

MiB = 2**20
PULL = GiB  # the 1 GiB pull
FIRST = 1_000_000  # the first get's object
CAPACITY = PULL + 256 * MiB  # per node: the object (node 1) or its copy (node 0)
PROBES = 400  # absent-id gets per kind per round


def probe_ids(count, home, shoal):
    """`count` random ids whose home in a 2-node cluster is `home`."""
    from shoal.testing import home_of

    ids = []
    while len(ids) < count:
        oid = shoal.ObjectID.from_random()
        if home_of(oid, 2) == home:
            ids.append(oid.hex())
    return ids


def pull(cluster, stamp, size=PULL, cpu=None):
    """Seconds of one pull; its CPU seconds (both daemons and the reader) appended to `cpu`."""
    got = cluster.pull(size, stamp)
    if cpu is not None:
        cpu.append(got["cpu_s"])
    return got["pull_s"]


def rpc_round(cluster, shoal):
    """Median get of absent ids homed remotely and locally (seconds)."""
    remote = cluster.reader.call(op="probe", ids=probe_ids(PROBES, 1, shoal))["times"]
    local = cluster.reader.call(op="probe", ids=probe_ids(PROBES, 0, shoal))["times"]
    return statistics.median(remote), statistics.median(local)


def first_get(tmp, errlog, tls, sample):
    """A fresh cluster; the first get of a 1 MB object on node 1 from node 0."""
    cluster = Shoal(os.path.join(tmp, f"first-{'tls' if tls else 'clear'}-{sample}"), errlog, tls=tls,
                    capacity=64 * MiB, tiers=False)  # fmt: skip
    try:
        cluster.start()
        return pull(cluster, 1000 + sample, FIRST)
    finally:
        cluster.stop()


def rate(seconds):
    """GiB/s of a 1 GiB pull that took `seconds`."""
    return PULL / seconds / GiB


def report(run):
    r = run["results"]
    med = {k: statistics.median(v) for k, v in r.items() if isinstance(v, list) and v}
    clear_pull, tls_pull = med["pull_clear"], med["pull_tls"]
    raw1, raw4 = min(r["raw_1"]), min(r["raw_4"])  # seconds: the best
    rawtls1, rawtls4 = min(r["rawtls_1"]), min(r["rawtls_4"])  # seconds: the best
    cpu_clear, cpu_tls = med["cpu_clear"], med["cpu_tls"]
    rpc_clear = med["rpc_remote_clear"] - med["rpc_local_clear"]
    rpc_tls = med["rpc_remote_tls"] - med["rpc_local_tls"]
    first_ratio = med["first_tls"] / med["first_clear"]
    pull_ratio = clear_pull / tls_pull  # throughput ratio tls / clear
    lines = [
        "# Peer traffic over TLS against cleartext (issue 44)",
        "",
        f"{run['date']}, `{run['command']}`, {run['checkout']}, {run['rounds']} rounds "
        f"in ABBA order; {run['machine']}; load {run['load']['start']:.1f} → "
        f"{run['load']['end']:.1f}; {run['seconds']:.0f} s. Two emulated 2-node clusters "
        "(`cluster up --modes mapped,network`, one with `--tls`): node 0 pulls node 1's "
        "objects over its data channel. The data channel with TLS encrypts in user space "
        "(rustls, AES-GCM); cleartext sends with sendfile.",
        "",
        "| measure | cleartext | TLS | TLS ÷ cleartext | target | met |",
        "|---|---:|---:|---:|---|---|",
        f"| 1 GiB pull, GiB/s (median) | {rate(clear_pull):.2f} | "
        f"{rate(tls_pull):.2f} | {pull_ratio:.2f}× | ≥ 0.75× | "
        f"{'yes' if pull_ratio >= 0.75 else 'no'} |",
        f"| peer RPC round trip p50, µs | {rpc_clear * 1e6:.1f} | {rpc_tls * 1e6:.1f} | "
        f"{rpc_tls / rpc_clear:.2f}× | ≤ 1.2× | {'yes' if rpc_tls <= 1.2 * rpc_clear else 'no'} |",
        f"| first get of 1 MB on a fresh cluster, ms (median) | {med['first_clear'] * 1e3:.2f} | "
        f"{med['first_tls'] * 1e3:.2f} | {first_ratio:.2f}× | ≤ 2× | "
        f"{'yes' if first_ratio <= 2 else 'no'} |",
        "",
        f"Raw-socket limit for the 1 GiB pull (network.py's loopback pair, best of the run): "
        f"1 stream {rate(raw1):.2f} GiB/s, 4 streams {rate(raw4):.2f} GiB/s; "
        f"cleartext shoal {raw4 / clear_pull:.2f}× and TLS {raw4 / tls_pull:.2f}× of the "
        "4-stream limit (shoal pulls 1 GiB in 4 ranges).",
        "",
        f"Raw TLS pair (the same pair over TLS 1.3, {run.get('rawtls_cipher')}; OpenSSL through "
        f"Python's ssl, the owner encrypting from the mapping): 1 stream {rate(rawtls1):.2f} GiB/s, "
        f"4 streams {rate(rawtls4):.2f} GiB/s; shoal's TLS pull is "
        f"{min(rawtls1, rawtls4) / tls_pull:.2f}× the better of the two.",
        "",
        f"CPU per pull (both daemons and the reader, median): cleartext {cpu_clear:.2f} s, "
        f"TLS {cpu_tls:.2f} s: TLS adds {cpu_tls - cpu_clear:.2f} s per GiB (the two ends' "
        "AES-GCM, the sender's copy into its records and its write where cleartext sends the "
        f"pages with sendfile), and on the {run['machine'].get('nproc')} cores both ends "
        "share here it comes out of the transfer's time.",
        "",
        f"RPC: single-id gets (timeout 0) of absent ids, {PROBES} per kind per round: homed "
        "on node 1 (one Lookup round trip) minus homed on node 0 (none); medians of the "
        f"whole call: remote {med['rpc_remote_clear'] * 1e6:.1f} / {med['rpc_remote_tls'] * 1e6:.1f} µs, "
        f"local {med['rpc_local_clear'] * 1e6:.1f} / {med['rpc_local_tls'] * 1e6:.1f} µs "
        "(cleartext / TLS).",
        "",
        "First get: a new pair of clusters per sample; the get on node 0 pulls the object "
        "over a data-channel connection that did not exist before (with TLS a full "
        "handshake: certificates both ways, ECDSA P-256; the RPC channel was opened by the "
        "first heartbeats, as it is on any started cluster).",
        "",
        "Samples (seconds): " + ", ".join(f"{k} {sorted(round(x, 6) for x in v)}" for k, v in r.items()),
        "",
    ]
    return "\n".join(lines)


def main(args):
    import shoal

    rounds = max(2, args.reps // 2)
    out = args.out
    if not out.endswith("network-tls.md"):  # network.py's default names its own report
        out = os.path.join(BENCH, "results", "network-tls.md")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    signal.signal(signal.SIGALRM, on_signal)
    signal.alarm(args.deadline)
    run = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python bench/network.py " + " ".join(sys.argv[1:]),
        "rounds": rounds,
        "machine": machine(),
        "checkout": checkout(),
        "load": {"start": os.getloadavg()[0]},
    }
    keys = ["pull_clear", "pull_tls", "cpu_clear", "cpu_tls", "raw_1", "raw_4", "rawtls_1", "rawtls_4",
            "rpc_remote_clear", "rpc_local_clear", "rpc_remote_tls", "rpc_local_tls", "first_clear",
            "first_tls"]  # fmt: skip
    results = {k: [] for k in keys}
    started, _busy, _own = time.monotonic(), machine_busy(), own_cpu()
    tmp = tempfile.mkdtemp(prefix="shoal-tlsbench-", dir="/tmp")
    clusters, raw, raw_tls = {}, None, None
    with open(os.path.join(os.path.dirname(os.path.abspath(out)), "raw-network-tls.log"), "w") as errlog:
        try:
            log("raw TCP pair (1 GiB) ...")
            raw = RawPair(os.path.basename(tmp), errlog, size=PULL)
            log("raw TLS pair (1 GiB) ...")
            tls_dir = os.path.join(tmp, "raw-tls")
            shoal_command("cluster", "ca", "--out", tls_dir).check_returncode()
            raw_tls = RawPair(os.path.basename(tmp) + "-tls", errlog, size=PULL, tls_dir=tls_dir)
            for tls in (False, True):
                name = "tls" if tls else "clear"
                log(f"shoal: 2-node cluster, {name} ...")
                directory = os.path.join(tmp, name)
                clusters[name] = Shoal(directory, errlog, tls=tls, capacity=CAPACITY, tiers=False)
                clusters[name].start()
            for i in range(rounds + 1):  # round 0 warms up, discarded
                order = ["clear", "tls"] if i % 2 else ["tls", "clear"]
                got = {}
                for name in order:
                    cpu = []
                    got[f"pull_{name}"] = pull(clusters[name], 10 * i + len(got), cpu=cpu)
                    got[f"cpu_{name}"] = cpu[0]
                    remote, local = rpc_round(clusters[name], shoal)
                    got[f"rpc_remote_{name}"], got[f"rpc_local_{name}"] = remote, local
                got["raw_1"] = raw.pull(PULL, 1, True)[0]
                got["raw_4"] = raw.pull(PULL, 4, True)[0]
                got["rawtls_1"] = raw_tls.pull(PULL, 1, False)[0]
                got["rawtls_4"] = raw_tls.pull(PULL, 4, False)[0]
                run["rawtls_cipher"] = raw_tls.cipher
                log(f"round {i}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in got.items()))
                if i > 0:
                    for k, v in got.items():
                        results[k].append(v)
            for name in list(clusters):
                clusters.pop(name).stop()
            for sample in range(rounds):
                order = [False, True] if sample % 2 else [True, False]
                for tls in order:
                    t = first_get(tmp, errlog, tls, sample)
                    results["first_tls" if tls else "first_clear"].append(t)
                log(f"first get {sample}: clear {results['first_clear'][-1] * 1e3:.2f} ms, "
                    f"tls {results['first_tls'][-1] * 1e3:.2f} ms")  # fmt: skip
        finally:
            signal.alarm(0)
            for cluster in clusters.values():
                try:
                    cluster.stop()
                except Exception as e:  # noqa: BLE001 - go on stopping the rest
                    log(f"stop: {e}")
            for pair in (raw, raw_tls):
                if pair is not None:
                    pair.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    run["results"] = results
    run["seconds"] = time.monotonic() - started
    run["load"]["end"] = os.getloadavg()[0]
    with open(os.path.join(os.path.dirname(os.path.abspath(out)), "raw-network-tls.json"), "w") as f:
        json.dump(run, f, indent=1)
    text = report(run)
    with open(out, "w") as f:
        f.write(text)
    log(f"wrote {out} in {run['seconds']:.0f} s")
