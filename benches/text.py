#!/usr/bin/env python3
"""Edit-distance benchmark: simjoin's `metric=levenshtein` against RapidFuzz and DuckDB on the same
strings, each peer's result count checked against simjoin's exact one.

Data (never downloaded here): the English word list of Debian's `wamerican` package
(/usr/share/dict/american-english; benches/run.sh installs it), misspellings of those words made
with a fixed seed (the kNN queries), and synthetic DNA-like reads (150 characters, a few mutations
from shared templates). simjoin runs as a user runs it: one `simjoin sql` process over Parquet files,
start-up and reading included. RapidFuzz times `process.cdist(…, scorer=Levenshtein.distance,
score_cutoff=k, workers=-1)` over query blocks (the full matrix would not fit in memory), DuckDB a
SQL self-join on `levenshtein(a.w, b.w) <= k` over a sample it can finish.

Usage: benches/text.py [--dir DIR] [--simjoin BIN] [--words FILE] [--device auto|cpu|gpu] [--tiny] [--plot PNG]
`--device gpu` runs simjoin's joins on the GPU (kNN of strings runs on the CPU cores either way);
DuckDB's row is left out where the duckdb module is not installed.
Prints a Markdown table; exits 1 when a peer's count differs from simjoin's."""
import argparse
import json
import os
import random
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

WORDS = "/usr/share/dict/american-english"


def mutate(rng, s, edits, alphabet):
    s = list(s)
    for _ in range(edits):
        op = rng.randrange(3)
        c = rng.choice(alphabet)
        if op == 0 and s:
            s[rng.randrange(len(s))] = c
        elif op == 1 and s:
            del s[rng.randrange(len(s))]
        else:
            s.insert(rng.randrange(len(s) + 1), c)
    return "".join(s)


def reads(n, seed):
    rng = random.Random(seed)
    templates = ["".join(rng.choice("ACGT") for _ in range(150)) for _ in range(max(1, n // 10))]
    return [mutate(rng, rng.choice(templates), rng.randrange(6), "ACGT") for _ in range(n)]


def write(path, strings):
    pq.write_table(pa.table({"id": pa.array(range(len(strings)), pa.int64()), "w": pa.array(strings)}), path)


def simjoin_sql(binary, sql):
    """(seconds, first value of the one-row result) of one `simjoin sql` process."""
    start = time.perf_counter()
    out = subprocess.run([binary, "sql", "--format", "csv", sql], check=True, capture_output=True, text=True).stdout
    elapsed = time.perf_counter() - start
    lines = [line for line in out.splitlines() if line.strip()]
    return elapsed, lines


def rapidfuzz_join_count(strings, k):
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    start = time.perf_counter()
    total = 0
    for i in range(0, len(strings), 2000):
        m = process.cdist(strings[i:i + 2000], strings, scorer=Levenshtein.distance, score_cutoff=k,
                          workers=-1, dtype=np.uint8)
        total += int((m <= k).sum())
    return time.perf_counter() - start, total - len(strings)  # ordered pairs, each row with itself left out


def rapidfuzz_knn(base, queries, k):
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    start = time.perf_counter()
    m = process.cdist(queries, base, scorer=Levenshtein.distance, workers=-1, dtype=np.int32)
    # Ties by base position, as simjoin breaks them: a stable sort of each row.
    order = np.argsort(m, axis=1, kind="stable")[:, :k]
    distances = np.take_along_axis(m, order, axis=1)
    return time.perf_counter() - start, order, distances


def duckdb_join_count(path, k):
    import duckdb

    con = duckdb.connect()
    con.execute(f"CREATE TABLE w AS SELECT * FROM read_parquet('{path}')")
    start = time.perf_counter()
    (count,) = con.execute(
        f"SELECT count(*) FROM w a, w b WHERE a.id <> b.id AND levenshtein(a.w, b.w) <= {k}").fetchone()
    return time.perf_counter() - start, count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="bench-out/text")
    parser.add_argument("--simjoin", default="target/release/simjoin")
    parser.add_argument("--tiny", action="store_true", help="small samples: the tooling test")
    parser.add_argument("--words", default=WORDS, help="the word list, one word a line")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"], help="simjoin's device for joins")
    parser.add_argument("--plot", default=None, help="write a bar chart of the times here (PNG)")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    if not os.path.exists(args.words):
        sys.exit(f"{args.words} is missing: install Debian's wamerican package (benches/run.sh does)")
    words = [w.rstrip("\n") for w in open(args.words, encoding="utf-8") if w.strip()]
    rng = random.Random(7)
    if args.tiny:
        words = words[::50]
    misspelt = [mutate(rng, rng.choice(words), 1 + rng.randrange(2), "abcdefghijklmnopqrstuvwxyz")
                for _ in range(100 if args.tiny else 1000)]
    dna = reads(600 if args.tiny else 10000, 11)
    sample = words[:: max(1, len(words) // (1000 if args.tiny else 5000))]
    paths = {name: os.path.join(args.dir, f"{name}.parquet") for name in ["words", "misspelt", "reads", "sample"]}
    for name, strings in [("words", words), ("misspelt", misspelt), ("reads", dna), ("sample", sample)]:
        write(paths[name], strings)

    rows = []  # (workload, n, k, result rows, simjoin s, peer, peer s, same count)
    failed = False

    def join(workload, name, strings, k, peers):
        nonlocal failed
        sql = f"SELECT count(*) FROM sim_join('{paths[name]}', {k}, 'metric=levenshtein, device={args.device}')"
        seconds, lines = simjoin_sql(args.simjoin, sql)
        count = int(lines[-1])
        for peer, run in peers:
            peer_seconds, peer_count = run()
            same = peer_count == count
            failed |= not same
            rows.append((workload, len(strings), k, count, seconds, peer, peer_seconds, same))

    for k in (1, 2):
        join("words self-join", "words", words, k, [
            ("RapidFuzz cdist (all cores)", lambda k=k: rapidfuzz_join_count(words, k))])
    try:
        import duckdb  # noqa: F401
        join("words sample self-join", "sample", sample, 2, [
            ("DuckDB levenshtein() join", lambda: duckdb_join_count(paths["sample"], 2))])
    except ImportError:
        pass
    for k in (4, 8):
        join("DNA reads self-join (150 chars)", "reads", dna, k, [
            ("RapidFuzz cdist (all cores)", lambda k=k: rapidfuzz_join_count(dna, k))])

    # kNN: the 5 closest words to each misspelling; every distance must equal RapidFuzz's.
    k = 5
    sql = (f"SELECT query_id, base_id, distance, rank FROM knn('{paths['words']}', '{paths['misspelt']}', {k}, "
           f"'metric=levenshtein') ORDER BY query_id, rank")
    seconds, lines = simjoin_sql(args.simjoin, sql)
    got = np.array([[float(x) for x in line.split(",")] for line in lines[1:]])
    peer_seconds, order, distances = rapidfuzz_knn(words, misspelt, k)
    same = (len(got) == len(misspelt) * k and np.array_equal(got[:, 1].reshape(-1, k), order)
            and np.array_equal(got[:, 2].reshape(-1, k), distances))
    failed |= not same
    rows.append(("kNN of misspellings", len(words), k, len(got), seconds, "RapidFuzz cdist + stable sort",
                 peer_seconds, same))

    print(f"Machine: {os.uname().machine}, {os.cpu_count()} cores.\n")
    print("| workload | strings | k | result rows | simjoin (s) | peer | peer (s) | peer ÷ simjoin | same result |")
    print("|---|---|---|---|---|---|---|---|---|")
    for workload, n, k, count, mine, peer, theirs, same in rows:
        ratio = theirs / mine
        shown = f"**{ratio:.1f}×**" if ratio >= 1 else f"{ratio:.2f}× (peer faster)"
        print(f"| {workload} | {n:,} | {k} | {count:,} | {mine:.3f} | {peer} | {theirs:.3f} | {shown} | "
              f"{'yes' if same else 'NO'} |")
    json.dump([dict(zip(["workload", "n", "k", "rows", "simjoin", "peer", "peer_s", "same"], r)) for r in rows],
              open(os.path.join(args.dir, "text.json"), "w"))
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels = [f"{w.replace(' (', chr(10) + '(')}\nk={k}" for w, _, k, *_ in rows]
        x = np.arange(len(rows))
        fig, ax = plt.subplots(figsize=(10, 4.5))
        ax.bar(x - 0.2, [r[4] for r in rows], 0.4, label="simjoin (whole process)")
        ax.bar(x + 0.2, [r[6] for r in rows], 0.4, label="peer (RapidFuzz / DuckDB)")
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log)")
        ax.set_xticks(x, labels, fontsize=7)
        ax.legend()
        ax.set_title("Edit-distance joins and kNN")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
