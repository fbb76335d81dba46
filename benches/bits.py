#!/usr/bin/env python3
"""Bit-string benchmark: simjoin's `metric=hamming` against faiss's IndexBinaryFlat (kNN and
range search) on the cores and a torch popcount brute force on the GPU, on the same codes.

Data (seeded, written here as Parquet, never downloaded): `--hashes N` 64-bit hashes, a tenth of
them near copies (1–4 bits flipped) of others, as perceptual-hash dedup sees them; `--codes N`
codes of `--bits` bits (random) and `--queries Q` queries, half of them near base rows.
simjoin runs as a user runs it: one `simjoin sql` process with the tables read into memory once
(`--in-memory`), each statement repeated `--repeat` times, the best time reported (the process's
own per-statement timings), and the first statement's rows checked against the peers'.

Usage: benches/bits.py [--dir DIR] [--simjoin BIN] [--device cpu|gpu|auto] [--hashes N] [--radius R]
                       [--codes N] [--bits B] [--queries Q] [--k K] [--repeat R] [--faiss] [--torch]
Prints a Markdown table; exits 1 when a peer's count differs from simjoin's."""
import argparse
import os
import re
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def near_copies(rng, rows, fraction, flips):
    """`rows` (n × bytes, uint8) with `fraction` of them replaced by copies of others, each with up
    to `flips` random bits flipped (a bit drawn twice flips back)."""
    n, width = rows.shape
    copies = rng.choice(n, size=int(n * fraction), replace=False)
    rows[copies] = rows[rng.integers(0, n, size=len(copies))]
    counts = rng.integers(1, flips + 1, size=len(copies))
    for f in range(1, flips + 1):
        chosen = copies[counts >= f]
        bits = rng.integers(0, width * 8, size=len(chosen))
        rows[chosen, bits // 8] ^= (1 << (bits % 8)).astype(np.uint8)
    return rows


def write_codes(path, rows):
    width = rows.shape[1]
    column = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(rows), [None, pa.py_buffer(np.ascontiguousarray(rows))])
    pq.write_table(pa.table({"id": np.arange(len(rows), dtype=np.int64), "c": column}), path, compression="zstd")


def simjoin_times(binary, tables, statements, repeat, device):
    """Best seconds of each statement and the first result's `count`, from one process."""
    script = ";\n".join(s for s in statements for _ in range(repeat))
    args = [binary, "sql", "--in-memory", "--device", device]
    for name, path in tables.items():
        args += ["-t", f"{name}={path}"]
    started = time.perf_counter()
    out = subprocess.run(args + [script], capture_output=True, text=True, check=True)
    total = time.perf_counter() - started
    times = [float(t) for t in re.findall(r"rows? in ([0-9.]+) s", out.stderr + out.stdout)]
    values = re.findall(r"^\|\s*(-?\d+)\s*\|$", out.stdout, re.M)
    best = [min(times[i * repeat:(i + 1) * repeat]) for i in range(len(statements))] if len(times) >= len(statements) * repeat else []
    return best, [int(v) for v in values], total


def faiss_range_count(codes, radius):
    import faiss

    index = faiss.IndexBinaryFlat(codes.shape[1] * 8)
    index.add(codes)
    started = time.perf_counter()
    lims, _, _ = index.range_search(codes, radius + 1)  # faiss: distance < radius
    seconds = time.perf_counter() - started
    # Pairs i < j (unordered, without self pairs), from the ordered pairs with self pairs.
    return seconds, (int(lims[-1]) - len(codes)) // 2


def faiss_knn(base, queries, k):
    import faiss

    index = faiss.IndexBinaryFlat(base.shape[1] * 8)
    index.add(base)
    started = time.perf_counter()
    distances, ids = index.search(queries, k)
    return time.perf_counter() - started, distances


def torch_knn(base, queries, k, repeat):
    """Hamming kNN on the GPU by brute force: XOR of 64-bit words, a SWAR popcount, topk, per
    block of queries and base rows; the best of `repeat` after a warm-up."""
    import torch

    words = base.view(np.int64).reshape(len(base), -1)
    b = torch.from_numpy(words).cuda()
    q = torch.from_numpy(queries.view(np.int64).reshape(len(queries), -1)).cuda()
    m1, m2, m4, h01 = (torch.tensor(v, dtype=torch.int64, device="cuda") for v in (0x5555555555555555, 0x3333333333333333, 0x0F0F0F0F0F0F0F0F, 0x0101010101010101))

    def popcount(x):
        x = x - ((x >> 1) & m1)
        x = (x & m2) + ((x >> 2) & m2)
        x = (x + (x >> 4)) & m4
        return (x * h01) >> 56 & 0xFF

    def run():
        best = []
        block = max(1, (1 << 28) // (len(base) * words.shape[1]))
        for s in range(0, len(q), block):
            d = popcount(q[s:s + block, None, :] ^ b[None, :, :]).sum(dim=2)
            best.append(torch.topk(d, k, dim=1, largest=False).values)
        torch.cuda.synchronize()
        return torch.cat(best)

    run()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return min(times), result.cpu().numpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="bench-out/bits")
    parser.add_argument("--simjoin", default="target/release/simjoin")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hashes", type=int, default=0)
    parser.add_argument("--radius", type=int, default=4)
    parser.add_argument("--codes", type=int, default=0)
    parser.add_argument("--bits", type=int, default=256)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--faiss", action="store_true")
    parser.add_argument("--torch", action="store_true")
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rng = np.random.default_rng(7)
    rows = []
    failed = False
    if args.hashes:
        hashes = near_copies(rng, rng.integers(0, 256, size=(args.hashes, 8), dtype=np.uint8), 0.1, 4)
        path = os.path.join(args.dir, f"hashes-{args.hashes}.parquet")
        write_codes(path, hashes)
        sql = f"SELECT count(*) FROM sim_join(h, {args.radius}, 'metric=hamming, pairs=unordered')"
        best, values, total = simjoin_times(args.simjoin, {"h": path}, [sql], args.repeat, args.device)
        rows.append((f"Hamming self-join, {args.hashes:,} × 64 bits, ≤ {args.radius}", f"simjoin ({args.device})", best[0] if best else float("nan"), values[0] if values else None))
        if args.faiss:
            seconds, count = faiss_range_count(hashes, args.radius)
            rows.append((rows[-1][0], "faiss IndexBinaryFlat.range_search", seconds, count))
            failed |= count != rows[-2][3]
    if args.codes:
        width = args.bits // 8
        base = rng.integers(0, 256, size=(args.codes, width), dtype=np.uint8)
        queries = base[rng.integers(0, args.codes, size=args.queries)].copy()
        queries[args.queries // 2:] = rng.integers(0, 256, size=(args.queries - args.queries // 2, width), dtype=np.uint8)
        near_copies(rng, queries, 0.5, 8)
        base_path, query_path = os.path.join(args.dir, f"codes-{args.codes}.parquet"), os.path.join(args.dir, f"queries-{args.queries}.parquet")
        write_codes(base_path, base)
        write_codes(query_path, queries)
        sql = f"SELECT CAST(sum(distance) AS BIGINT) FROM knn(b, q, {args.k}, 'metric=hamming')"
        best, values, total = simjoin_times(args.simjoin, {"b": base_path, "q": query_path}, [sql], args.repeat, args.device)
        name = f"Hamming kNN, {args.queries:,} × {args.codes:,} × {args.bits} bits, k = {args.k}"
        rows.append((name, f"simjoin ({args.device})", best[0] if best else float("nan"), values[0] if values else None))
        if args.faiss:
            seconds, distances = faiss_knn(base, queries, args.k)
            rows.append((name, "faiss IndexBinaryFlat.search", seconds, int(distances.sum())))
            failed |= int(distances.sum()) != rows[-2][3]
        if args.torch:
            seconds, distances = torch_knn(base, queries, args.k, args.repeat)
            rows.append((name, "torch popcount brute force (GPU)", seconds, int(distances.sum())))
            failed |= int(distances.sum()) != rows[-2][3]
    print("| workload | run | seconds | result |\n|---|---|---|---|")
    for workload, run, seconds, result in rows:
        print(f"| {workload} | {run} | {seconds:.4f} | {result} |")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
