#!/usr/bin/env python3
"""Set-similarity benchmark: simjoin's `metric=jaccard` self-join against SetSimilaritySearch
(exact, AllPairs), datasketch's MinHashLSH (approximate: its recall against the exact pairs is
reported with its time) and DuckDB (the same join in SQL over list functions), on the same sets.

Data (never downloaded): `--sets N` synthetic sets, sizes Poisson around `--mean` tokens drawn from
a Zipf vocabulary (skewed, as words and shingles are), a fifth of them near copies of others with
about a tenth of their tokens replaced, so that near duplicates exist; or, with `--debian`, the word
sets of the package descriptions of `apt-cache dumpavail` (templated descriptions are real near
duplicates). simjoin runs as a user runs it: one new `simjoin sql` process over the Parquet file,
start-up and reading included. The peers run on the first `--peer-sets` sets where that is fewer
(simjoin again on those, for the same count), DuckDB on at most 5,000; `--skip` leaves peers out.

Usage: benches/sets.py [--dir DIR] [--simjoin BIN] [--sets N] [--mean M] [--vocabulary V]
                       [--threshold T] [--peer-sets N] [--debian] [--skip PEER …]
Prints a Markdown table; exits 1 when an exact peer's count differs from simjoin's."""
import argparse
import os
import re
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def synthetic(n, mean, vocabulary, seed):
    rng = np.random.default_rng(seed)
    # Zipf draws repeat tokens: a quarter more draws leaves about `mean` distinct ones.
    sizes = np.maximum(1, rng.poisson(mean * 1.25, size=n))
    weights = 1.0 / np.arange(1, vocabulary + 1) ** 1.05
    tokens = rng.choice(vocabulary, size=int(sizes.sum()), p=weights / weights.sum())
    sets = np.split(tokens, np.cumsum(sizes)[:-1])
    copies = rng.choice(n, size=n // 5, replace=False)
    for i in copies:
        source = sets[rng.integers(0, n)]
        kept = source[rng.random(len(source)) > 0.1]
        fresh = rng.choice(vocabulary, size=len(source) - len(kept))
        sets[i] = np.concatenate([kept, fresh])
    return [np.unique(s) for s in sets]


def debian_descriptions():
    """The word sets of the package descriptions `apt-cache dumpavail` prints."""
    out = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    descriptions, current = [], None
    for line in out.splitlines():
        if line.startswith("Description:"):
            current = [line[len("Description:"):]]
        elif current is not None and line.startswith(" "):
            current.append(line)
        elif current is not None:
            descriptions.append(" ".join(current))
            current = None
    vocabulary = {}
    sets = []
    for text in descriptions:
        words = {vocabulary.setdefault(w, len(vocabulary)) for w in re.findall(r"\w+", text.lower())}
        sets.append(np.array(sorted(words), dtype=np.int64))
    return sets


def write(path, sets):
    offsets = np.concatenate([[0], np.cumsum([len(s) for s in sets])]).astype(np.int32)
    values = pa.array(np.concatenate(sets).astype(np.int64))
    column = pa.ListArray.from_arrays(pa.array(offsets), values)
    pq.write_table(pa.table({"id": np.arange(len(sets), dtype=np.int64), "s": column}), path)


def simjoin_count(binary, path, threshold):
    sql = f"SELECT count(*) FROM sim_join('{path}', {1 - threshold!r}, 'metric=jaccard, pairs=unordered')"
    started = time.perf_counter()
    out = subprocess.run([binary, "sql", "--format", "csv", sql], capture_output=True, text=True, check=True).stdout
    return time.perf_counter() - started, int(out.strip().splitlines()[-1])


def exact_pairs(binary, path, threshold, directory):
    """The pairs within the threshold, for the recall of the approximate peer: simjoin's exact
    answer (the exact peers' counts agree with it), written to Parquet and read back."""
    out = os.path.join(directory, "pairs.parquet")
    sql = f"SELECT left_id, right_id FROM sim_join('{path}', {1 - threshold!r}, 'metric=jaccard, pairs=unordered')"
    subprocess.run([binary, "sql", "-o", out, sql], capture_output=True, text=True, check=True)
    pairs = pq.read_table(out)
    return set(zip(pairs.column("left_id").to_pylist(), pairs.column("right_id").to_pylist()))


def set_similarity_search(sets, threshold):
    from SetSimilaritySearch import all_pairs

    started = time.perf_counter()
    pairs = sum(1 for _ in all_pairs([list(s) for s in sets], similarity_func_name="jaccard", similarity_threshold=threshold))
    return time.perf_counter() - started, pairs


def minhash_lsh(sets, threshold, truth):
    """datasketch at its defaults (128 permutations): MinHashes, the index, and every set's query;
    the candidate pairs it returns, and how many of the true pairs they hold."""
    from datasketch import MinHash, MinHashLSH

    started = time.perf_counter()
    lsh = MinHashLSH(threshold=threshold, num_perm=128)
    hashes = MinHash.bulk([[str(t).encode() for t in s] for s in sets], num_perm=128)
    with lsh.insertion_session() as session:
        for i, m in enumerate(hashes):
            session.insert(i, m)
    found = set()
    for i, m in enumerate(hashes):
        found.update((min(i, j), max(i, j)) for j in lsh.query(m) if j != i)
    seconds = time.perf_counter() - started
    recall = len(found & truth) / max(1, len(truth))
    return seconds, len(found), recall


def duckdb_count(path, threshold, n):
    import duckdb

    sql = f"""
        WITH t AS (SELECT id, s FROM read_parquet('{path}') WHERE id < {n})
        SELECT count(*) FROM t a JOIN t b ON a.id < b.id
        WHERE len(list_intersect(a.s, b.s)) >= {threshold} * len(list_distinct(list_concat(a.s, b.s)))"""
    started = time.perf_counter()
    count = duckdb.sql(sql).fetchall()[0][0]
    return time.perf_counter() - started, count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="bench-out/sets")
    parser.add_argument("--simjoin", default="target/release/simjoin")
    parser.add_argument("--sets", type=int, default=100_000)
    parser.add_argument("--mean", type=int, default=50)
    parser.add_argument("--vocabulary", type=int, default=100_000)
    parser.add_argument("--threshold", type=float, default=0.8, help="the Jaccard similarity (simjoin: eps = 1 − it)")
    parser.add_argument("--peer-sets", type=int, default=None, help="the peers run on this many of the sets")
    parser.add_argument("--debian", action="store_true", help="Debian's package descriptions instead")
    parser.add_argument("--skip", nargs="*", default=[], help="peers left out: sss, lsh, duckdb")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    sets = debian_descriptions() if args.debian else synthetic(args.sets, args.mean, args.vocabulary, 7)
    name = "debian" if args.debian else f"zipf-{len(sets)}-{args.mean}"
    path = os.path.join(args.dir, f"{name}.parquet")
    write(path, sets)
    rows = []
    seconds, count = simjoin_count(args.simjoin, path, args.threshold)
    rows.append((len(sets), "simjoin sql (new process, Parquet file)", seconds, count, "exact"))
    peer_n = min(len(sets), args.peer_sets or len(sets))
    failed = False
    if peer_n < len(sets):
        peer_path = os.path.join(args.dir, f"{name}-first-{peer_n}.parquet")
        write(peer_path, sets[:peer_n])
        seconds, count = simjoin_count(args.simjoin, peer_path, args.threshold)
        rows.append((peer_n, "simjoin sql (new process, Parquet file)", seconds, count, "exact"))
    simjoin_peer_count = rows[-1][3]
    peer_sets = sets[:peer_n]
    if "sss" not in args.skip:
        seconds, count = set_similarity_search(peer_sets, args.threshold)
        rows.append((peer_n, "SetSimilaritySearch all_pairs", seconds, count, "exact"))
        failed |= count != simjoin_peer_count
    if "lsh" not in args.skip:
        peer_file = path if peer_n == len(sets) else os.path.join(args.dir, f"{name}-first-{peer_n}.parquet")
        truth = exact_pairs(args.simjoin, peer_file, args.threshold, args.dir)
        seconds, candidates, recall = minhash_lsh(peer_sets, args.threshold, truth)
        rows.append((peer_n, "datasketch MinHashLSH (128 perm, candidates)", seconds, candidates, f"recall {recall:.3f}"))
    if "duckdb" not in args.skip:
        n = min(peer_n, 5000)
        small = os.path.join(args.dir, f"{name}-first-{n}.parquet")
        write(small, sets[:n])
        seconds, count = duckdb_count(small, args.threshold, n)
        s_seconds, s_count = simjoin_count(args.simjoin, small, args.threshold)
        rows.append((n, "DuckDB list_intersect self-join", seconds, count, "exact"))
        rows.append((n, "simjoin sql (new process, Parquet file)", s_seconds, s_count, "exact"))
        failed |= count != s_count
    print(f"Jaccard similarity ≥ {args.threshold} ({name}, mean {np.mean([len(s) for s in sets]):.1f} tokens)\n")
    print("| sets | run | seconds | pairs | answer |\n|---|---|---|---|---|")
    for n, run, seconds, count, answer in rows:
        print(f"| {n:,} | {run} | {seconds:.3f} | {count:,} | {answer} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
