#!/usr/bin/env python3
"""DBSCAN benchmark: simjoin's `dbscan(t, eps, min_points)` against scikit-learn's DBSCAN (the same
labels), the user's workaround today (simjoin lists the ε-pairs to Parquet, then scipy's
connected_components over them; for min_points = 1 only, where DBSCAN is the components), and the
count-only self-join as the floor.

Data (seeded, written here as Parquet): `--blobs N` 2-d points in 40 Gaussian blobs with a tenth
uniform noise; `--file F` the points of a Parquet file (an `id`, then a vector column, e.g. P3's
from `simjoin bench`); `--glove N` the first N GloVe 6B 50d vectors of `glove-base.parquet` in --dir
(benches/glove.py writes it; unit rows, so L2 ranks as cosine); `--words N` the English word list
of Debian's `wamerican` then misspellings of its words (one edit each) up to N strings, within
`--word-edits` edits. simjoin runs as a user runs it: a
new `simjoin sql` process per statement over the file, its own statement time reported (best of
--repeat), the whole process's wall time beside it. Labels are checked: the same noise and the same
partition of the core rows as scikit-learn's (border rows may join either cluster they touch).

Usage: benches/dbscan.py [--dir DIR] [--simjoin BIN] [--device cpu|gpu] [--blobs N] [--file F] [--eps E]
                         [--glove N] [--glove-eps E] [--words N] [--word-edits K] [--min-points M] [--repeat R] [--sklearn] [--pairs]
Prints a Markdown table; exits 1 when labels differ."""
import argparse
import os
import random
import re
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


WORDS = "/usr/share/dict/american-english"


def write_points(path, points):
    flat = pa.array(points.astype(np.float32).reshape(-1), type=pa.float32())
    column = pa.FixedSizeListArray.from_arrays(flat, points.shape[1])
    pq.write_table(pa.table({"id": np.arange(len(points), dtype=np.int64), "v": column}), path)


def blobs(n, rng):
    noise = n // 10
    centres = rng.uniform(0, 1, size=(40, 2))
    points = centres[rng.integers(0, 40, size=n - noise)] + rng.normal(0, 0.01, size=(n - noise, 2))
    return np.concatenate([points, rng.uniform(0, 1, size=(noise, 2))])


def simjoin_run(binary, path, sql, repeat, device, out=None):
    """Best statement seconds and best whole-process seconds over `repeat` new processes."""
    best, wall = float("inf"), float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        proc = subprocess.run([binary, "sql", "--device", device, "-t", f"t={path}", sql], capture_output=True, text=True, check=True)
        wall = min(wall, time.perf_counter() - started)
        best = min(best, float(re.findall(r"rows? in ([0-9.]+) s", proc.stderr + proc.stdout)[-1]))
    return best, wall, proc.stdout


def same_labels(mine, theirs, core):
    """The same noise, and core rows grouped alike (a bijection between the two labelings)."""
    if not np.array_equal(mine < 0, theirs < 0):
        return False
    pairs = set(zip(mine[core].tolist(), theirs[core].tolist()))
    return len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs})


def run_case(args, rows, name, path, n, dims, eps, options, points=None):
    """One data set's rows of the table: `path` holds `n` rows (an `id`, then the clustered column);
    scikit-learn runs where `points` (their coordinates) are given."""
    stem = name.split()[0].lower()
    label_file = os.path.join(args.dir, f"{stem}-labels.parquet")
    sql = f"COPY (SELECT id, cluster_id, core FROM dbscan(t, {eps}, {args.min_points}, '{options}')) TO '{label_file}'"
    seconds, wall, _ = simjoin_run(args.simjoin, path, sql, args.repeat, args.device)
    labels = pq.read_table(label_file).to_pandas().sort_values("id")
    mine = labels["cluster_id"].fillna(-1).to_numpy(np.int64)
    core = labels["core"].to_numpy(bool)
    clusters = len(set(mine[mine >= 0].tolist()))
    workload = f"{name}, {n:,} × {dims}, eps = {eps:g}, min_points = {args.min_points}"
    rows.append((workload, f"simjoin dbscan ({args.device})", seconds, wall, f"{clusters:,} clusters, {int((mine < 0).sum()):,} noise"))
    count_sql = f"SELECT count(*) FROM sim_join(t, {eps}, '{options}, pairs=unordered')"
    floor, floor_wall, out = simjoin_run(args.simjoin, path, count_sql, args.repeat, args.device)
    pairs = int(re.findall(r"^\|\s*(\d+)\s*\|$", out, re.M)[0])
    rows.append((workload, "floor: count-only self-join (simjoin)", floor, floor_wall, f"{pairs:,} pairs"))
    failed = False
    if args.sklearn and points is not None:
        from sklearn.cluster import DBSCAN

        started = time.perf_counter()
        # min_samples counts the point itself, as simjoin's min_points does.
        theirs = DBSCAN(eps=eps, min_samples=args.min_points, n_jobs=-1).fit_predict(points.astype(np.float32).astype(np.float64))
        seconds = time.perf_counter() - started
        same = same_labels(mine, theirs, core)
        failed |= not same
        rows.append((workload, "scikit-learn DBSCAN (n_jobs=-1)", seconds, seconds, "same labels" if same else "LABELS DIFFER"))
    if args.pairs and args.min_points == 1:
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        pair_file = os.path.join(args.dir, f"{stem}-pairs.parquet")
        pair_sql = f"COPY (SELECT left_id, right_id FROM sim_join(t, {eps}, '{options}, pairs=unordered')) TO '{pair_file}'"
        listed, listed_wall, _ = simjoin_run(args.simjoin, path, pair_sql, 1, args.device)
        started = time.perf_counter()
        table = pq.read_table(pair_file)
        left, right = table["left_id"].to_numpy(), table["right_id"].to_numpy()
        graph = coo_matrix((np.ones(len(left), dtype=np.int8), (left, right)), shape=(n, n))
        count, components = connected_components(graph, directed=False)
        union = time.perf_counter() - started
        same = same_labels(mine, components, core)
        failed |= not same
        rows.append((workload, "simjoin pairs to Parquet + scipy connected_components", listed_wall + union, listed_wall + union, f"{count:,} components, {'same' if same else 'DIFFER'}"))
    return failed


def words(n, rng):
    """The word list, then misspellings of its words (one edit each) up to `n` strings."""
    listed = [w.rstrip("\n") for w in open(WORDS, encoding="utf-8") if w.strip()][:n]
    strings = list(listed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    while len(strings) < n:
        s = list(listed[rng.randrange(len(listed))])
        i = rng.randrange(len(s) + 1)
        op = rng.randrange(3)
        if op == 0 and i < len(s):
            s[i] = rng.choice(letters)
        elif op == 1 and i < len(s):
            del s[i]
        else:
            s.insert(i, rng.choice(letters))
        strings.append("".join(s))
    return strings


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="bench-out/dbscan")
    parser.add_argument("--simjoin", default="target/release/simjoin")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--blobs", type=int, default=0)
    parser.add_argument("--eps", type=float, default=0.002)
    parser.add_argument("--file", help="a Parquet file of `id` and one vector column (e.g. P3's points)")
    parser.add_argument("--glove", type=int, default=0)
    parser.add_argument("--glove-eps", type=float, default=0.6)
    parser.add_argument("--words", type=int, default=0)
    parser.add_argument("--word-edits", type=int, default=1)
    parser.add_argument("--min-points", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sklearn", action="store_true")
    parser.add_argument("--pairs", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rows, failed = [], False
    cases = []
    if args.blobs:
        cases.append(("blobs", blobs(args.blobs, np.random.default_rng(7)), args.eps))
    if args.file:
        vectors = pq.read_table(args.file).columns[1].combine_chunks()
        cases.append((os.path.basename(args.file), vectors.flatten().to_numpy().reshape(len(vectors), -1), args.eps))
    if args.glove:
        vectors = pq.read_table(os.path.join(args.dir, "glove-base.parquet"))["vector"].combine_chunks()
        cases.append(("GloVe 6B 50d", vectors.flatten().to_numpy().reshape(len(vectors), -1)[: args.glove], args.glove_eps))
    for name, points, eps in cases:
        path = os.path.join(args.dir, f"{name.split()[0].lower()}-{len(points)}.parquet")
        write_points(path, points)
        failed |= run_case(args, rows, name, path, len(points), points.shape[1], eps, "column=v", points)
    if args.words:
        path = os.path.join(args.dir, f"words-{args.words}.parquet")
        strings = words(args.words, random.Random(7))
        pq.write_table(pa.table({"id": pa.array(range(len(strings)), pa.int64()), "w": pa.array(strings)}), path)
        failed |= run_case(args, rows, "words and misspellings", path, len(strings), "text", args.word_edits, "column=w, metric=levenshtein")
    print("| workload | run | seconds (statement) | seconds (process) | result |\n|---|---|---|---|---|")
    for workload, run, seconds, wall, result in rows:
        print(f"| {workload} | {run} | {seconds:.3f} | {wall:.3f} | {result} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
