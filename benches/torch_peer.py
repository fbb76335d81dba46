#!/usr/bin/env python3
"""The PyTorch brute-force peer on a GPU: the workloads of DIR/simjoin.json (written by
`simjoin bench --gpu-workloads --device gpu --dir DIR`), each as tiled torch.cdist + count (joins,
range queries) or torch.cdist + topk (kNN) on the same Parquet files, FP32 (TF32 off) and TF32.
Counts are compared with simjoin's. Each mode is timed twice: including moving the inputs to the
GPU (like simjoin's first run, which starts from host memory), and again with them already there
("resident", like simjoin's later runs, which find their vectors kept on the device); the
resident run is repeated as simjoin's best is (`--repeat`, as given to `simjoin bench`; repeats
stop once they have taken `--repeat-seconds`) and its best time reported. torch's distances are
f32 (TF32: 10-bit mantissa products), so its pairs and neighbours near the threshold or the k-th
distance may differ from the exact ones."""
import argparse
import json
import os
import time

import numpy as np
import pyarrow.parquet as pq
import torch


def load(path):
    column = pq.read_table(path).column("vector").combine_chunks()
    dim = column.type.list_size
    return np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)


def count_within(left, right, eps, self_join, tile):
    """Pairs (i, j) with ‖l_i − r_j‖ ≤ eps; self-joins count i < j."""
    total = 0
    for start in range(0, left.shape[0], tile):
        d = torch.cdist(left[start:start + tile], right)
        hits = d <= eps
        if self_join:
            rows = torch.arange(start, min(start + tile, left.shape[0]), device=left.device)[:, None]
            hits &= torch.arange(right.shape[0], device=left.device)[None, :] > rows
        total += int(hits.sum())
    return total


def knn_rows(queries, base, k, tile):
    """Rows of the k nearest base rows of every query (cdist + topk, tile by tile)."""
    rows = 0
    for start in range(0, queries.shape[0], tile):
        d = torch.cdist(queries[start:start + tile], base)
        values, indices = torch.topk(d, k, dim=1, largest=False)
        rows += indices.numel()
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="bench-out")
    parser.add_argument("--tile", type=int, default=2048)
    parser.add_argument("--only", help="run only workloads whose name contains this (as simjoin bench --only)")
    parser.add_argument("--repeat", type=int, default=3, help="resident runs of each mode, the best reported (as simjoin bench --repeat)")
    parser.add_argument("--repeat-seconds", type=float, default=10.0, help="no further resident run once they have taken this long")
    args = parser.parse_args()
    results = []
    # CUDA's context is created here, outside every timing.
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    for w in json.load(open(os.path.join(args.dir, "simjoin.json"))):
        # The listed variants of a workload (summed, written to Parquet) have the count's peer.
        if (args.only and args.only not in w["name"]) or w.get("output", "count") != "count":
            continue
        base_np = load(os.path.join(args.dir, w["base"]))
        queries_np = load(os.path.join(args.dir, w["queries"])) if w["queries"] else None
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            base = left = None
            for resident in (False, True):
                seconds, spent = float("inf"), 0.0
                for run in range(max(1, args.repeat - 1) if resident else 1):
                    if run > 0 and spent >= args.repeat_seconds:
                        break
                    torch.cuda.synchronize()
                    started = time.perf_counter()
                    if not resident:
                        base = torch.from_numpy(base_np).cuda()
                        left = base if queries_np is None else torch.from_numpy(queries_np).cuda()
                    if w["kind"] == "knn":
                        # A query tile's distance row block stays near 4 GB whatever the base size.
                        tile = max(1, min(args.tile, (1 << 30) // base.shape[0]))
                        count = knn_rows(left, base, min(w["k"], base.shape[0]), tile)
                    else:
                        count = count_within(left, base, w["threshold"], queries_np is None, args.tile)
                    torch.cuda.synchronize()
                    elapsed = time.perf_counter() - started
                    seconds, spent = min(seconds, elapsed), spent + elapsed
                mode = ("TF32" if tf32 else "FP32") + (" resident" if resident else "")
                # Against simjoin's first run (inputs from host memory) or its best (inputs kept).
                simjoin_s = w["simjoin_s"] if resident else w.get("simjoin_first_s", w["simjoin_s"])
                same = "same as" if count == w["rows"] else "DIFFERENT from"
                what = "rows" if w["kind"] == "knn" else "pairs"
                print(f"{w['name']}: torch cdist {mode}: {seconds:.3f} s, {count} {what} ({same} simjoin's {w['rows']}); "
                      f"simjoin {simjoin_s:.3f} s, ratio {seconds / simjoin_s:.1f}x", flush=True)
                results.append({"workload": w["name"], "peer": f"torch cdist {mode}", "seconds": seconds, "results": count,
                                "simjoin_results": w["rows"], "simjoin_s": simjoin_s})
    json.dump(results, open(os.path.join(args.dir, "torch.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
