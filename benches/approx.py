#!/usr/bin/env python3
"""Approximate kNN: FAISS's HNSW and IVF indexes on the data `simjoin bench --approx` measured,
added to its results (approx.json in --dir) and plotted as recall@10 against queries per second.

FAISS (faiss-cpu, all cores) runs on the same Parquet files, k = 10: `IndexHNSWFlat` (M = 32,
efConstruction = 80) at several efSearch, `IndexIVFFlat` (4·√n lists) at several nprobe; hnswlib
(M = 16, ef_construction = 100) and usearch (connectivity 16, expansion_add 128) at several search
efforts, all on every core. Recall
is counted against FAISS's own exact `IndexFlatL2`, whose lists equal simjoin's exact ones up to
ties; simjoin's rows come from approx.json (its recall against its own exact answer). Build times
are reported apart from search.

Usage: pip install faiss-cpu hnswlib usearch; benches/approx.py [--dir DIR] [--plot PNG]   (after `simjoin bench --approx --dir DIR`)"""
import argparse
import json
import math
import os
import time

import faiss
import hnswlib
import numpy as np
import usearch.index
import pyarrow.parquet as pq

K = 10


def vectors(path):
    table = pq.read_table(path)
    name = "vector" if "vector" in table.column_names else "pixels"
    column = table.column(name).combine_chunks()
    dim = column.type.list_size
    return np.ascontiguousarray(column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim))


def recall(found, truth):
    return sum(len(set(f) & set(t)) for f, t in zip(found, truth)) / truth.size


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def peers(base, queries):
    rows = []
    flat = faiss.IndexFlatL2(base.shape[1])
    flat.add(base)
    (_, truth), flat_s = timed(lambda: flat.search(queries, K))
    rows.append(("faiss IndexFlatL2 (exact)", None, 1.0, flat_s, None))
    hnsw = faiss.IndexHNSWFlat(base.shape[1], 32)
    hnsw.hnsw.efConstruction = 80
    _, build = timed(lambda: hnsw.add(base))
    for ef in [16, 32, 64, 128, 256]:
        hnsw.hnsw.efSearch = ef
        (_, found), seconds = timed(lambda: hnsw.search(queries, K))
        rows.append(("faiss IndexHNSWFlat", f"efSearch={ef}", recall(found, truth), seconds, build if ef == 16 else None))
    threads = faiss.omp_get_max_threads()
    graph = hnswlib.Index(space="l2", dim=base.shape[1])
    graph.init_index(max_elements=len(base), M=16, ef_construction=100, random_seed=1)
    graph.set_num_threads(threads)
    _, build = timed(lambda: graph.add_items(base, np.arange(len(base))))
    for ef in [16, 32, 64, 128, 256]:
        graph.set_ef(max(ef, K))
        (found, _), seconds = timed(lambda: graph.knn_query(queries, K, num_threads=threads))
        rows.append(("hnswlib", f"ef={ef}", recall(found, truth), seconds, build if ef == 16 else None))
    usearch_index = usearch.index.Index(ndim=base.shape[1], metric="l2sq", dtype="f32", connectivity=16,
                                        expansion_add=128)
    _, build = timed(lambda: usearch_index.add(np.arange(len(base)), base, threads=threads))
    for ef in [16, 32, 64, 128, 256]:
        usearch_index.expansion_search = ef
        found, seconds = timed(lambda: usearch_index.search(queries, K, threads=threads).keys)
        rows.append(("usearch", f"expansion_search={ef}", recall(found, truth), seconds, build if ef == 16 else None))
    lists = int(4 * math.sqrt(len(base)))
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatL2(base.shape[1]), base.shape[1], lists)
    _, build = timed(lambda: (ivf.train(base), ivf.add(base)))
    for probe in [1, 4, 16, 64]:
        ivf.nprobe = probe
        (_, found), seconds = timed(lambda: ivf.search(queries, K))
        rows.append(("faiss IndexIVFFlat", f"nprobe={probe}", recall(found, truth), seconds, build if probe == 1 else None))
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="bench-out/approx")
    parser.add_argument("--plot")
    parser.add_argument("--replot", action="store_true", help="only plot the last run's approx-all.json")
    parser.add_argument("--peers-max-rows", type=int,
                        help="run FAISS only on bases of at most this many rows (its HNSW build of 10^6 rows takes ~10 min on 2 cores)")
    args = parser.parse_args()
    if args.replot:
        plot(json.load(open(os.path.join(args.dir, "approx-all.json"))), args.plot)
        return
    records = json.load(open(os.path.join(args.dir, "approx.json")))
    records = [r for r in records if not r["method"].startswith("faiss")]
    print(f"faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads")
    print("| data | method | setting | recall@10 | queries/s | index build (s) |\n|---|---|---|---|---|---|")
    for data in dict.fromkeys(r["data"] for r in records):
        ours = [r for r in records if r["data"] == data]
        first = ours[0]
        base = vectors(os.path.join(args.dir, first["base_file"]))
        queries = vectors(os.path.join(args.dir, first["queries_file"]))
        for r in ours:
            setting = r["setting"]
            build = "–" if r["build_s"] is None else f"{r['build_s']:.2f}"
            print(f"| {data} | {r['method']} | {setting} | {r['recall']:.4f} | {r['queries_per_s']:.0f} | {build} |")
        if args.peers_max_rows is not None and len(base) > args.peers_max_rows:
            continue
        for method, setting, rec, seconds, build in peers(base, queries):
            qps = len(queries) / seconds
            print(f"| {data} | {method} | {setting or 'exact'} | {rec:.4f} | {qps:.0f} | {'–' if build is None else f'{build:.2f}'} |")
            records.append({**{k: first[k] for k in ("data", "n", "dim", "queries", "k")}, "method": method,
                            "setting": setting, "recall": rec, "seconds": seconds, "queries_per_s": qps,
                            "build_s": build})
    json.dump(records, open(os.path.join(args.dir, "approx-all.json"), "w"), indent=1)
    if args.plot:
        plot(records, args.plot)


def plot(records, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    datasets = list(dict.fromkeys(r["data"] for r in records))
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), squeeze=False)
    for ax, data in zip(axes[0], datasets):
        for method in dict.fromkeys(r["method"] for r in records if r["data"] == data):
            points = [r for r in records if r["data"] == data and r["method"] == method]
            xs, ys = [p["recall"] for p in points], [p["queries_per_s"] for p in points]
            ax.plot(xs, ys, "o-" if len(points) > 1 else "s", label=method)
        ax.set_yscale("log")
        ax.set_xlabel("recall@10")
        ax.set_ylabel("queries / s")
        ax.set_title(data)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
