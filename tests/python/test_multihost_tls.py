"""Peer traffic between isolated hosts over TLS (issue 44).

Every cluster of the multi-host harness runs over TLS 1.3: a CA made on the test machine
(the operator's), each host's certificate issued there for the public key the host sent,
and a revocation list every host reads. Here what an operator sees of it; a host whose
certificate is from another CA, refused by the others until it gets a good one (the others
keep running); and a revocation that takes effect while every daemon runs.
"""

from __future__ import annotations

import os
import sys

import pytest
from _shoal_testing import ids_homed_at, shoal_ok
from multihost import until

import shoal

pytestmark = pytest.mark.alone


def public_key(hosts, node: int) -> str:
    text = (hosts.directory / "cluster.toml").read_text()
    tables = text.split("[[node]]")[1:]
    line = next(line for line in tables[node].splitlines() if line.startswith("public_key"))
    return line.split('"')[1]


def test_hosts_talk_over_tls_and_say_so(make_hosts):
    hosts = make_hosts(2)
    a, b = hosts
    blob = os.urandom(3 << 20)
    oid = a.client.put(blob)
    assert bytes(b.client.get(oid, timeout_ms=5000)) == blob  # pulled over the data channel
    for h in hosts:
        assert h.exec("result = client.peer_encryption") == "tls1.3, data channel tls-userspace"
        assert "peer traffic over TLS 1.3" in h.log()
    stat = a.run(sys.executable, "-m", "shoal", "stat", "--socket", hosts.path("socket", 0))
    assert "traffic tls1.3, data channel tls-userspace" in stat["stdout"], stat


def test_a_host_with_another_cas_certificate_is_refused_until_it_gets_a_good_one(make_hosts, tmp_path):
    hosts = make_hosts(3)
    # Host 2 comes back trusting, and holding a certificate of, a CA of its own: a stranger
    # with the right node id and key.
    hosts.kill(2)
    rogue = tmp_path / "rogue"
    shoal_ok("cluster", "ca", "--out", str(rogue))
    stranger = hosts.issue_certificate(rogue, 2, public_key(hosts, 2), tmp_path / "rogue-n2")
    hosts.install_certificate(2, rogue, stranger)
    hosts.start(2, wait=False)
    hosts.wait_serving(2)
    refusal = "peer RPC connection refused: TLS handshake failed"
    until(lambda: refusal in hosts[0].log(), 15, "host 0 refusing")
    # Its heartbeats are refused both ways: within a lease each side counts the other down.
    until(lambda: 2 not in hosts[0].sees() and 2 not in hosts[1].sees(), 10, "hosts 0, 1 counting 2 out")
    until(lambda: hosts[2].sees() == {2}, 10, "host 2 counting the others out")
    # Hosts 0 and 1 go on between themselves. An id whose home is the stranger cannot be
    # claimed there: typed, and a put under a fresh id takes another (whichever the id).
    with pytest.raises(shoal.errors.HomeUnavailable, match="TLS refused"):
        hosts[0].client.put(b"homed at the stranger", ids_homed_at(2, 1)[0])
    for _ in range(12):  # about a third of fresh ids are homed at node 2
        oid = hosts[0].client.put(b"between the two")
        assert bytes(hosts[1].client.get(oid, timeout_ms=5000)) == b"between the two"
    # The stranger gets nothing of theirs: refused, typed.
    with pytest.raises((shoal.errors.PermissionDenied, shoal.errors.NodeUnavailable)):
        hosts[2].client.get(oid, timeout_ms=2000)

    # A certificate of the cluster's CA, and host 2 is a member again (0 and 1 never stopped).
    hosts.kill(2)
    assert hosts.ca is not None
    member = hosts.issue_certificate(hosts.ca, 2, public_key(hosts, 2), tmp_path / "n2")
    hosts.install_certificate(2, hosts.ca, member)
    hosts.start(2)
    assert bytes(hosts[2].client.get(oid, timeout_ms=5000)) == b"between the two"


def test_a_revocation_takes_effect_while_every_daemon_runs(make_hosts):
    hosts = make_hosts(2)
    a, b = hosts
    first = b.client.put(os.urandom(1 << 20))
    assert a.client.get(first, timeout_ms=5000) is not None  # a pull from host 1: admitted
    hosts.revoke(1)

    # Within a second every node reads the list again; each pull opens a new connection
    # (of a new object each time: one pulled before the reload stays a local copy).
    def refused() -> bool:
        try:
            a.client.get(b.client.put(os.urandom(1 << 20)), timeout_ms=500)
        except (shoal.errors.PermissionDenied, shoal.errors.NodeUnavailable) as e:
            return "TLS refused" in str(e)
        return False

    until(refused, 10, "host 0 refusing host 1's revoked certificate")
    assert "would be refused by its peers" in b.log() or "do not load" in b.log()
