"""Homes computed in Python (`shoal.testing.home_of`) equal the daemon's (crates/shoal-cluster/
src/view.rs): both check tests/vectors/homes.txt, and a join moves only the newcomer's ids."""

from pathlib import Path

import shoal
from shoal.testing import home_of, id_hash

VECTORS = Path(__file__).resolve().parents[1] / "vectors" / "homes.txt"


def test_the_shared_vectors_hold():
    lines = [line.split() for line in VECTORS.read_text().splitlines() if line and not line.startswith("#")]
    assert len(lines) >= 64
    for hex_id, hash_hex, at3, at4, at134 in lines:
        raw = bytes.fromhex(hex_id)
        assert f"{id_hash(raw):016x}" == hash_hex
        assert home_of(raw, 3) == int(at3)
        assert home_of(shoal.ObjectID(raw), [0, 1, 2, 3]) == int(at4)
        assert home_of(raw, [4, 3, 1]) == int(at134)


def test_a_join_moves_about_a_share_and_only_to_the_newcomer():
    ids = [shoal.ObjectID.from_random() for _ in range(4000)]
    moved = 0
    for oid in ids:
        before, after = home_of(oid, 3), home_of(oid, 4)
        if before != after:
            assert after == 3
            moved += 1
    assert 0.2 < moved / len(ids) < 0.3
