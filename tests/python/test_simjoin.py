"""The Python package against independent answers: numpy's f64 brute force (sums in order, as
docs/sql.md defines each distance, so distances compare bit for bit), RapidFuzz for the edit
distance, and the same SQL through datafusion-python. Run by .ci/run from a wheel built on the
clean clone: `python -m pytest tests/python`."""

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import simjoin

METRICS = ["l2", "l2sq", "cosine", "inner_product", "l1", "linf"]


def brute_force(metric, a, b):
    """Every distance of rows of `a` to rows of `b` in f64, each sum taken in coordinate order."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    acc = np.zeros((len(a), len(b)))
    if metric == "cosine":
        na = np.zeros((len(a), 1))
        nb = np.zeros((1, len(b)))
    for j in range(a.shape[1]):
        x = a[:, None, j]
        y = b[None, :, j]
        if metric in ("l2", "l2sq"):
            d = x - y
            acc = acc + d * d
        elif metric == "l1":
            acc = acc + np.abs(x - y)
        elif metric == "linf":
            acc = np.maximum(acc, np.abs(x - y))
        elif metric == "inner_product":
            acc = acc + x * y
        elif metric == "cosine":
            acc = acc + x * y
            na = na + x * x
            nb = nb + y * y
    if metric == "l2":
        return np.sqrt(acc)
    if metric == "inner_product":
        return -acc
    if metric == "cosine":
        return 1.0 - acc / (np.sqrt(na) * np.sqrt(nb))
    return acc


def data(rows, dims, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    values = rng.random((rows, dims))
    if np.dtype(dtype).kind in "iu":
        return (values * 20).astype(dtype)
    return values.astype(dtype)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16])
def test_knn_equals_brute_force(metric, dtype):
    base = data(300, 7, 1, dtype)
    base[100] = base[7]  # ties at equal distance: ranked by base row
    queries = data(40, 7, 2, dtype)
    k = 9
    distances, ids = simjoin.knn(base, queries, k, metric=metric)
    exact = brute_force(metric, queries, base)
    order = np.lexsort((np.broadcast_to(np.arange(len(base)), exact.shape), exact), axis=1)[:, :k]
    expected = np.take_along_axis(exact, order, axis=1)
    assert distances.shape == (40, k) and ids.shape == (40, k)
    assert np.array_equal(ids, order)
    assert np.array_equal(distances.view(np.uint64), expected.view(np.uint64))


def test_knn_fewer_base_rows_than_k():
    distances, ids = simjoin.knn(data(3, 4, 1), data(2, 4, 2), 5)
    assert (ids[:, 3:] == -1).all() and np.isinf(distances[:, 3:]).all()
    assert sorted(ids[0, :3]) == [0, 1, 2]


def test_knn_fortran_order_and_arrow_inputs():
    base = data(200, 5, 3, np.float64)
    queries = data(10, 5, 4, np.float64)
    reference = simjoin.knn(base, queries, 4)
    fortran = simjoin.knn(np.asfortranarray(base), queries, 4)
    flat = pa.array(base.reshape(-1))
    arrow = simjoin.knn(pa.FixedSizeListArray.from_arrays(flat, 5), queries, 4)
    lists = simjoin.knn(base.tolist(), queries.tolist(), 4)
    for other in (fortran, arrow, lists):
        assert np.array_equal(reference.ids, other.ids)
        assert np.array_equal(reference.distances, other.distances)
    table = simjoin.knn(base, queries, 4, output="arrow")
    assert table.column_names == ["query_id", "base_id", "distance", "rank"] and table.num_rows == 40


def pairs_of(exact, r, same=False, unordered=False):
    left, right = np.nonzero(exact <= r)
    keep = np.ones(len(left), dtype=bool)
    if same:
        keep &= left != right
    if unordered:
        keep &= left < right
    left, right = left[keep], right[keep]
    return left, right, exact[left, right]


@pytest.mark.parametrize("metric", METRICS)
def test_range_query_equals_brute_force(metric):
    base = data(400, 3, 5)
    queries = data(30, 3, 6)
    exact = brute_force(metric, queries, base)
    r = float(np.quantile(exact, 0.05))
    got = simjoin.range_query(base, queries, r, metric=metric, sort=True)
    left, right, distances = pairs_of(exact, r)
    assert np.array_equal(got.left, left) and np.array_equal(got.right, right)
    assert np.array_equal(got.distances.view(np.uint64), distances.view(np.uint64))


@pytest.mark.parametrize("metric", ["l2", "cosine", "l1", "linf"])
@pytest.mark.parametrize("pairs", ["ordered", "unordered"])
def test_self_join_equals_brute_force(metric, pairs):
    points = data(500, 2, 7)
    exact = brute_force(metric, points, points)
    eps = float(np.quantile(exact, 0.01))
    got = simjoin.sim_join(points, eps, metric=metric, pairs=pairs, sort=True)
    left, right, distances = pairs_of(exact, eps, same=True, unordered=pairs == "unordered")
    assert len(left) > 0
    assert np.array_equal(got.left, left) and np.array_equal(got.right, right)
    assert np.array_equal(got.distances.view(np.uint64), distances.view(np.uint64))


def test_two_table_join_equals_brute_force():
    a, b = data(300, 4, 8), data(200, 4, 9)
    exact = brute_force("l2", a, b)
    got = simjoin.sim_join(a, 0.2, b, sort=True)
    left, right, distances = pairs_of(exact, 0.2)
    assert np.array_equal(got.left, left) and np.array_equal(got.right, right)
    assert np.array_equal(got.distances, distances)


def words():
    path = "/usr/share/dict/american-english"
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            return [w.strip() for w in f if w.strip()][::97][:1500]
    rng = np.random.default_rng(0)
    return ["".join(rng.choice(list("abcde"), rng.integers(1, 9))) for _ in range(1500)]


def test_levenshtein_equals_rapidfuzz():
    from rapidfuzz.distance import Levenshtein
    from rapidfuzz.process import cdist

    base = words()
    queries = base[::50] + ["recieve", "seperate"]
    expected = cdist(queries, base, scorer=Levenshtein.distance, score_cutoff=2, dtype=np.int32)
    left, right = np.nonzero(expected <= 2)
    got = simjoin.range_query(base, queries, 2, metric="levenshtein", sort=True)
    assert np.array_equal(got.left, left) and np.array_equal(got.right, right)
    assert np.array_equal(got.distances, expected[left, right].astype(np.float64))
    distances, ids = simjoin.knn(base, queries, 3, metric="levenshtein")
    full = cdist(queries, base, scorer=Levenshtein.distance, dtype=np.int32)
    order = np.lexsort((np.broadcast_to(np.arange(len(base)), full.shape), full), axis=1)[:, :3]
    assert np.array_equal(ids, order)


def test_hamming_and_tanimoto_over_numpy_bits_equal_brute_force():
    rng = np.random.default_rng(5)
    centres = rng.integers(0, 2**63, size=6, dtype=np.uint64)
    flips = (np.uint64(1) << rng.integers(0, 64, size=(800, 3)).astype(np.uint64)).sum(axis=1, dtype=np.uint64)
    hashes = centres[rng.integers(0, 6, size=800)] ^ (flips * (rng.random(800) < 0.7)).astype(np.uint64)
    popcount = np.vectorize(lambda x: bin(int(x)).count("1"))
    differ = popcount(hashes[:, None] ^ hashes[None, :])
    pairs = simjoin.sim_join(hashes, 3, metric="hamming", pairs="unordered", sort=True)
    i, j = np.nonzero(np.triu(differ <= 3, 1))
    assert np.array_equal(pairs.left, i) and np.array_equal(pairs.right, j)
    assert np.array_equal(pairs.distances, differ[i, j].astype(np.float64))
    # Bytes (uint8 rows) as bits; the k nearest by Hamming, ties by base row.
    as_bytes = hashes.view(np.uint8).reshape(-1, 8)
    distances, ids = simjoin.knn(as_bytes, as_bytes[:20], 5, metric="hamming")
    order = np.lexsort((np.broadcast_to(np.arange(800), (20, 800)), differ[:20]), axis=1)[:, :5]
    assert np.array_equal(ids, order)
    both = popcount(hashes[:20, None] & hashes[None, :])
    either = popcount(hashes[:20, None] | hashes[None, :])
    tanimoto = np.where(either == 0, 0.0, 1.0 - both / np.maximum(either, 1))
    distances, ids = simjoin.knn(hashes, hashes[:20], 3, metric="jaccard")
    assert np.array_equal(distances, np.take_along_axis(tanimoto, ids, axis=1))


def test_jaccard_over_token_lists_equals_brute_force():
    rng = np.random.default_rng(6)
    words = [f"w{i}" for i in range(30)]
    sets = [list(rng.choice(words, size=rng.integers(0, 8))) for _ in range(300)]
    def jaccard(a, b):
        a, b = set(a), set(b)
        return 0.0 if not a | b else 1.0 - len(a & b) / len(a | b)
    pairs = simjoin.sim_join(sets, 0.4, metric="jaccard", pairs="unordered", sort=True)
    want = [(i, j) for i in range(300) for j in range(i + 1, 300) if jaccard(sets[i], sets[j]) <= 0.4]
    assert list(zip(pairs.left.tolist(), pairs.right.tolist())) == want
    assert all(d == jaccard(sets[i], sets[j]) for i, j, d in zip(pairs.left, pairs.right, pairs.distances))
    with pytest.raises(ValueError, match="a set and a bit string"):
        simjoin.sim_join(sets, 0.4, np.zeros(3, dtype=np.uint64), metric="jaccard")


def test_dbscan_labels_equal_scikit_learns_on_core_points_and_noise():
    from sklearn.cluster import DBSCAN

    rng = np.random.default_rng(8)
    centres = rng.random((6, 2))
    points = np.concatenate([centres[rng.integers(0, 6, 3000)] + rng.normal(0, 0.02, (3000, 2)), rng.random((300, 2))])
    for eps, min_points in [(0.02, 5), (0.03, 10), (0.01, 1)]:
        ours = simjoin.dbscan(points, eps, min_points)
        reference = DBSCAN(eps=eps, min_samples=min_points).fit(points)
        core = np.zeros(len(points), dtype=bool)
        core[reference.core_sample_indices_] = True
        assert np.array_equal(ours == -1, reference.labels_ == -1)
        # The same partition of the core points, up to the clusters' numbers.
        pairs = set(zip(ours[core].tolist(), reference.labels_[core].tolist()))
        assert len(pairs) == len(set(ours[core].tolist())) == len(set(reference.labels_[core].tolist()))
    table = simjoin.dbscan(points, 0.02, 5, output="arrow")
    assert table.column_names == ["id", "cluster_id", "core"]


def test_session_sql_over_numpy_pandas_polars_and_files(tmp_path):
    import duckdb
    import pandas
    import polars

    ctx = simjoin.SessionContext(device="cpu")
    points = data(100, 3, 10)
    ctx.register("points", points)
    frame = pandas.DataFrame({"id": np.arange(5), "vector": list(data(5, 3, 11).astype(np.float64))})
    ctx.register("from_pandas", frame)
    ctx.register("from_polars", polars.from_pandas(frame))
    path = tmp_path / "pyarrow.parquet"
    pq.write_table(pa.table({"id": np.arange(100), "vector": list(points)}), path)
    ctx.register_parquet("from_parquet", str(path))
    duck = tmp_path / "duckdb.parquet"
    duckdb.sql(f"COPY (SELECT * FROM read_parquet('{path}')) TO '{duck}' (FORMAT parquet)")
    ctx.register_parquet("from_duckdb", str(duck))
    expected = simjoin.knn(points, frame["vector"].tolist(), 3)
    for queries in ("from_pandas", "from_polars"):
        for base in ("points", "from_parquet", "from_duckdb"):
            table = ctx.sql(f"SELECT query_id, base_id, distance FROM knn({base}, {queries}, 3) ORDER BY query_id, rank")
            assert isinstance(table, pa.Table)
            assert np.array_equal(table.column("base_id").to_numpy().reshape(5, 3), expected.ids)
            assert np.array_equal(table.column("distance").to_numpy().reshape(5, 3), expected.distances)
    # The plain SQL join is planned as sim_join (the standalone session's optimizer rule).
    plan = ctx.sql("EXPLAIN SELECT a.id, b.id FROM points a JOIN points b ON l2_distance(a.vector, b.vector) <= 0.1")
    assert "SimilarityExec" in " ".join(plan.column("plan").to_pylist())
    count = ctx.sql("SELECT count(*) AS n FROM points a JOIN points b ON l2_distance(a.vector, b.vector) <= 0.1")
    exact = brute_force("l2", points, points)
    assert count.column("n")[0].as_py() == int((exact <= 0.1).sum())
    stream = ctx.sql("SELECT * FROM sim_join(points, 0.2)", stream=True)
    assert isinstance(stream, pa.RecordBatchReader)
    assert stream.read_all().num_rows == int((exact <= 0.2).sum() - len(points))


def test_options_by_keyword_and_set():
    ctx = simjoin.connect(metric="cosine")
    ctx.register("p", data(50, 3, 12))
    cosine = ctx.sql("SELECT distance FROM knn(p, p, 2) ORDER BY query_id, rank").column("distance").to_numpy()
    ctx.set("metric", "l1")
    l1 = ctx.sql("SELECT distance FROM knn(p, p, 2) ORDER BY query_id, rank").column("distance").to_numpy()
    assert np.array_equal(cosine, np.sort(brute_force("cosine", data(50, 3, 12), data(50, 3, 12)), axis=1)[:, :2].reshape(-1))
    assert np.array_equal(l1, np.sort(brute_force("l1", data(50, 3, 12), data(50, 3, 12)), axis=1)[:, :2].reshape(-1))
    with pytest.raises(ValueError, match="metric"):
        simjoin.SessionContext(metric="hammer")


def test_datafusion_python_extension(tmp_path):
    import datafusion
    import pandas
    import polars

    ctx = datafusion.SessionContext()
    simjoin.register(ctx)
    base = data(200, 4, 13)
    queries = data(6, 4, 14)
    ctx.from_pandas(pandas.DataFrame({"id": np.arange(200), "vector": list(base)}), name="base")
    ctx.from_polars(polars.DataFrame({"id": np.arange(6), "vector": list(queries)}), name="queries")
    path = tmp_path / "base.parquet"
    pq.write_table(pa.table({"id": np.arange(200), "vector": list(base)}), path)
    ctx.register_parquet("base_file", str(path))
    expected = simjoin.knn(base, queries, 4)
    for table in ("base", "base_file"):
        got = ctx.sql(f"SELECT query_id, base_id, distance FROM knn({table}, queries, 4) ORDER BY query_id, rank")
        got = pa.Table.from_batches(got.collect())
        assert np.array_equal(got.column("base_id").to_numpy().reshape(6, 4), expected.ids)
        assert np.array_equal(got.column("distance").to_numpy().reshape(6, 4), expected.distances)
    options = ctx.sql("SELECT count(*) AS n FROM knn(base, queries, 4, 'metric=cosine, device=cpu')")
    assert pa.Table.from_batches(options.collect()).column("n")[0].as_py() == 24
    scalar = ctx.sql("SELECT l2_distance(vector, [0.5, 0.5, 0.5, 0.5]) AS d FROM queries ORDER BY id")
    expected_d = brute_force("l2", queries, np.full((1, 4), 0.5, dtype=np.float32))[:, 0]
    assert np.array_equal(pa.Table.from_batches(scalar.collect()).column("d").to_numpy(), expected_d)
    with pytest.raises(Exception, match="argument 'k'"):
        ctx.sql("SELECT * FROM knn(base, queries, 0)").collect()


def run_python(code):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_other_datafusion_major_is_an_import_error():
    result = run_python(
        """
        import datafusion, simjoin
        datafusion.__version__ = "54.1.0"
        try:
            simjoin.register(datafusion.SessionContext())
        except ImportError as error:
            print(error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "datafusion-python 55" in result.stdout and "54.1.0" in result.stdout


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: simjoin.knn(data(5, 3, 1), data(2, 3, 2), 0), "argument 'k'"),
        (lambda: simjoin.knn(data(5, 3, 1), data(2, 3, 2), -3), "argument 'k'"),
        (lambda: simjoin.knn(data(5, 3, 1), data(2, 4, 2), 2), "dimension"),
        (lambda: simjoin.knn(np.array([[1, 2], [3, np.nan]]), data(2, 2, 2), 1), "row 1 contains NaN"),
        (lambda: simjoin.knn([[1.0, 2.0], [3.0]], data(2, 2, 2), 1), "different lengths"),
        (lambda: simjoin.knn(np.zeros((4, 2), dtype=np.complex64), data(2, 2, 2), 1), "dtype complex64"),
        (lambda: simjoin.knn(data(5, 3, 1), data(2, 3, 2), 2, metric="hamming"), "metric"),
        (lambda: simjoin.range_query(data(5, 3, 1), data(2, 3, 2), -1.0), "r"),
        (lambda: simjoin.sim_join(data(5, 3, 1), float("nan")), "NaN"),
        (lambda: simjoin.sim_join(data(5, 3, 1), 0.1, pairs="some"), "pairs"),
        (lambda: simjoin.knn(data(5, 3, 1), data(2, 3, 2), 2, device="tpu"), "device"),
        (lambda: simjoin.knn(object(), data(2, 3, 2), 2), "cannot read"),
    ],
)
def test_bad_input_is_a_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
    # The process lives on and answers.
    assert simjoin.knn(data(5, 3, 1), data(2, 3, 2), 1).ids.shape == (2, 1)


def test_large_input_is_not_copied():
    """A 1 GB float32 array registered in a session: the process's peak memory grows by far less
    than the array (Arrow reads numpy's buffer)."""
    result = run_python(
        """
        import resource, numpy as np, simjoin
        peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        array = np.ones((2_000_000, 128), dtype=np.float32)  # 1.02 GB, touched
        before = peak()
        ctx = simjoin.SessionContext()
        ctx.register("big", array)
        n = ctx.sql("SELECT count(*) AS n FROM big").column("n")[0].as_py()
        print(n, peak() - before)
        """
    )
    assert result.returncode == 0, result.stderr
    rows, grown = map(int, result.stdout.split())
    assert rows == 2_000_000
    assert grown < 200 * 2**20, f"peak memory grew by {grown / 2**20:.0f} MiB registering a 1 GiB array"


def test_ctrl_c_cancels_a_query():
    result = run_python(
        """
        import os, signal, threading, time, numpy as np, simjoin
        points = np.random.default_rng(0).random((400_000, 2), dtype=np.float32)
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        start = time.time()
        try:
            simjoin.sim_join(points, 0.5, device="cpu", output="arrow")  # billions of pairs
            print("finished")
        except KeyboardInterrupt:
            print("interrupted", round(time.time() - start, 1))
        print(simjoin.knn(points[:10], points[:2], 1).ids[:, 0].tolist())
        """
    )
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.split("\n")[:2]
    assert first.startswith("interrupted") and float(first.split()[1]) < 10
    assert second == "[0, 1]"
