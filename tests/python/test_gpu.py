"""The package on the GPU: each function with device="gpu" against numpy's f64 brute force, bit for
bit. Skipped where no GPU is usable (the reason is printed); SIMJOIN_REQUIRE_GPU=1 makes that a
failure, as for `cargo test`."""

import os

import numpy as np
import pytest

import simjoin
from test_simjoin import brute_force, data, pairs_of


@pytest.fixture(scope="module")
def gpu():
    try:
        simjoin.knn(data(4, 2, 0), data(1, 2, 1), 1, device="gpu")
    except (ValueError, RuntimeError) as error:
        if os.environ.get("SIMJOIN_REQUIRE_GPU") == "1":
            pytest.fail(f"SIMJOIN_REQUIRE_GPU=1 but no GPU is usable: {error}")
        pytest.skip(f"no usable GPU: {error}")


@pytest.mark.parametrize("metric", ["l2", "cosine", "inner_product", "l1"])
def test_knn_on_the_gpu(gpu, metric):
    base = data(20_000, 64, 1)
    queries = data(300, 64, 2)
    distances, ids = simjoin.knn(base, queries, 10, metric=metric, device="gpu")
    exact = brute_force(metric, queries, base)
    order = np.lexsort((np.broadcast_to(np.arange(len(base)), exact.shape), exact), axis=1)[:, :10]
    assert np.array_equal(ids, order)
    assert np.array_equal(distances, np.take_along_axis(exact, order, axis=1))


def test_range_query_and_join_on_the_gpu(gpu):
    base = data(30_000, 8, 3)
    queries = data(200, 8, 4)
    exact = brute_force("l2", queries, base)
    got = simjoin.range_query(base, queries, 0.4, device="gpu", sort=True)
    left, right, distances = pairs_of(exact, 0.4)
    assert np.array_equal(got.left, left) and np.array_equal(got.right, right)
    assert np.array_equal(got.distances, distances)
    points = data(20_000, 3, 5)
    cpu = simjoin.sim_join(points, 0.03, device="cpu", sort=True)
    on_gpu = simjoin.sim_join(points, 0.03, device="gpu", sort=True)
    assert len(cpu.left) > 0
    for a, b in zip(cpu, on_gpu):
        assert np.array_equal(a, b)
