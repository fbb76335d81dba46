#!/usr/bin/env python3
"""Record linkage with a blocking key: every pair of person records in the same zip code whose
names are within 2 edits, as the same SQL text in simjoin and DuckDB, and as RapidFuzz's cdist
per zip code in Python. Each row times a whole new process (min and median of --repeat runs) and
checks that every peer finds as many pairs.

    python benches/linkage.py --rows 1000000 --repeat 3 --simjoin target/release/simjoin

The records (written once to --dir, seeded): a first and a last name drawn from the system word
list (/usr/share/dict/american-english, ASCII words only), a zip code drawn from 2,000 codes with
Zipf-like sizes (a few large towns, many small ones), and about 30 % of them near-duplicates of an
earlier record: the same zip code (90 %) and the name with one or two typos (a substituted,
deleted, inserted or swapped letter). About 1 % of names and of zip codes are NULL.
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import textwrap
import time

WORDS = "/usr/share/dict/american-english"
SQL = "SELECT count(*) FROM people a JOIN people b ON a.zip = b.zip AND levenshtein(a.name, b.name) <= 2"


def typo(name, rng):
    """`name` with one edit: a letter substituted, deleted, inserted, or two adjacent swapped."""
    i = rng.randrange(len(name))
    letter = rng.choice("abcdefghijklmnopqrstuvwxyz")
    kind = rng.randrange(4)
    if kind == 0:
        return name[:i] + letter + name[i + 1 :]
    if kind == 1 and len(name) > 1:
        return name[:i] + name[i + 1 :]
    if kind == 2:
        return name[:i] + letter + name[i:]
    if i + 1 < len(name):
        return name[:i] + name[i + 1] + name[i] + name[i + 2 :]
    return name + letter


def write_records(path, rows, seed=7):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    words = [w.strip() for w in open(WORDS, encoding="utf-8")]
    words = [w for w in words if w.isascii() and w.isalpha() and len(w) >= 3]
    firsts = [w.capitalize() for w in rng.sample(words, 400)]
    lasts = [w.capitalize() for w in rng.sample(words, 20000)]
    zips = [f"{10000 + 37 * i:05d}" for i in range(2000)]
    weights = [1.0 / (i + 1) ** 0.8 for i in range(len(zips))]
    names, codes = [], []
    for i in range(rows):
        if i > 0 and rng.random() < 0.3:
            j = rng.randrange(i)
            name, code = names[j] or rng.choice(firsts) + " " + rng.choice(lasts), codes[j]
            for _ in range(rng.choice((1, 1, 2))):
                name = typo(name, rng)
            if rng.random() < 0.1:
                code = rng.choices(zips, weights)[0]
        else:
            name, code = rng.choice(firsts) + " " + rng.choice(lasts), rng.choices(zips, weights)[0]
        names.append(None if rng.random() < 0.01 else name)
        codes.append(None if rng.random() < 0.01 else code)
    table = pa.table({"id": pa.array(range(rows), pa.int64()), "zip": codes, "name": names})
    pq.write_table(table, path)


# Each peer: the code of one process; it prints the pair count.
PROGRAMS = {
    "duckdb": """
        import duckdb
        con = duckdb.connect()
        con.execute("SET threads = THREADS")
        con.execute("SET enable_progress_bar = false")
        con.execute("CREATE VIEW people AS SELECT * FROM read_parquet('PATH')")
        print(con.execute(SQL).fetchone()[0])
    """,
    "rapidfuzz": """
        import collections, numpy as np, pyarrow.parquet as pq
        from rapidfuzz import process
        from rapidfuzz.distance import Levenshtein
        t = pq.read_table('PATH', columns=['zip', 'name']).to_pydict()
        blocks = collections.defaultdict(list)
        for code, name in zip(t['zip'], t['name']):
            if code is not None and name is not None:
                blocks[code].append(name)
        pairs = 0
        for names in blocks.values():
            m = process.cdist(names, names, scorer=Levenshtein.distance, score_cutoff=2, dtype=np.int32, workers=THREADS)
            pairs += int((m <= 2).sum())
        print(pairs)
    """,
}


def timed(command, repeat, timeout):
    """Min and median seconds of `repeat` runs of `command`, and its last output line; a run
    stopped at `timeout` seconds ends the row (`None` for its times and output)."""
    times, out = [], ""
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, None, None
        times.append(time.perf_counter() - start)
        out = done.stdout.strip().splitlines()[-1]
    return min(times), statistics.median(times), out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/linkage")
    parser.add_argument("--simjoin", default="target/release/simjoin")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--timeout", type=float, default=300, help="seconds after which a run is stopped")
    parser.add_argument("--skip", default="", help="peers to leave out, comma-separated (duckdb, rapidfuzz)")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    path = os.path.join(args.dir, f"people_{args.rows}.parquet")
    if not os.path.exists(path):
        write_records(path, args.rows)

    rows = []
    sql = SQL
    simjoin = [args.simjoin, "sql", "--format", "csv", "-t", f"people={path}", sql]
    rows.append(("simjoin sql (same SQL text)", *timed(simjoin, args.repeat, args.timeout)))
    listed = sql.replace("SELECT count(*)", "SELECT count(*), sum(a.id - b.id)")
    simjoin_listed = [args.simjoin, "sql", "--format", "csv", "-t", f"people={path}", listed]
    rows.append(("simjoin sql, every pair listed (sum of ids)", *timed(simjoin_listed, args.repeat, args.timeout)))
    for peer, program in PROGRAMS.items():
        if peer in args.skip.split(","):
            continue
        code = textwrap.dedent(program).replace("PATH", path).replace("THREADS", str(args.threads))
        code = f"SQL = {sql!r}\n" + code
        rows.append((peer, *timed([sys.executable, "-c", code], args.repeat, args.timeout)))

    counts = {int(out.split(",")[0]) for _, _, _, out in rows if out is not None}
    print(f"{args.rows:,} records, {args.threads} threads: {SQL}")
    print("| peer | min s | median s | pairs |")
    print("|---|---|---|---|")
    for name, best, median, out in rows:
        if out is None:
            print(f"| {name} | > {args.timeout:.0f} (stopped) | | |")
        else:
            print(f"| {name} | {best:.3f} | {median:.3f} | {out.split(',')[0]} |")
    if len(counts) != 1:
        sys.exit(f"the peers disagree on the pair count: {sorted(counts)}")


if __name__ == "__main__":
    main()
