"""The Dask jobs whose results the shoal.dask tests compare with stock Dask's: a dataframe
groupby-aggregate, a merge, a set_index, and array reductions (test_dask.py on one host,
multihost_dask_driver.py on two)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da
import dask.dataframe as dd
import numpy as np
import pandas as pd


def jobs(rows: int, keys: int, partitions: int) -> tuple[dd.DataFrame, Callable[[], dict[str, Any]]]:
    """A frame of `rows` rows (`keys` distinct keys) in `partitions` partitions, and a maker
    of the jobs over it (new collections each call: compute them under any scheduler)."""
    rng = np.random.default_rng(42)
    left = pd.DataFrame(
        {"k": rng.integers(0, keys, rows), "v": rng.random(rows), "w": rng.integers(0, 10**6, rows)}
    )
    right = pd.DataFrame({"k": np.arange(keys), "name": [f"n{i}" for i in range(keys)]})
    frame = dd.from_pandas(left, npartitions=partitions)
    other = dd.from_pandas(right, npartitions=2)
    array = da.from_array(rng.random((1000, 1000)), chunks=(250, 250))

    def make() -> dict[str, Any]:
        return {
            "groupby": frame.groupby("k").agg({"v": "sum", "w": "max"}),
            "merge": frame.merge(other, on="k").groupby("name").v.mean(),
            "set_index": frame.set_index("w").v.sum(),
            "array": (array.sum(axis=0), (array @ array.T).mean(), array.std()),
        }

    return frame, make


def equal(got: dict[str, Any], want: dict[str, Any]) -> dict[str, bool]:
    """Per job whether two computations of `jobs` agree (floating sums to rounding)."""
    return {
        "groupby": bool(got["groupby"].sort_index().equals(want["groupby"].sort_index())),
        "merge": bool(np.allclose(got["merge"].sort_index(), want["merge"].sort_index())),
        "set_index": bool(np.isclose(got["set_index"], want["set_index"])),
        "array": all(bool(np.allclose(a, b)) for a, b in zip(got["array"], want["array"], strict=True)),
    }
