#!/usr/bin/env python3
"""simjoin's Python package against the Python peers, each run as users run it: a new Python
process that imports its library, loads the inputs from .npy files (or a word list) and answers.
Each row times the whole process (min and median of --repeat runs) and checks that both sides
return as many results.

    python benches/python.py --dir /tmp/pybench --repeat 5            # 2 cores: faiss, sklearn, cKDTree, RapidFuzz
    python benches/python.py --dir /tmp/pybench --repeat 5 --only gpu # an H200: torch cdist+topk

Needs the simjoin wheel and the peers (faiss-cpu, scikit-learn, scipy, rapidfuzz; torch for gpu).
"""

import argparse
import math
import os
import statistics
import subprocess
import sys
import textwrap
import time

import numpy as np

WORDS = "/usr/share/dict/american-english"


def prepare(directory, groups):
    """The inputs of `groups`, written once: seeded Gaussian and uniform vectors."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(42)
    files = {
        "knn_base": lambda: rng.standard_normal((100_000, 128), dtype=np.float32),
        "knn_queries": lambda: rng.standard_normal((1_000, 128), dtype=np.float32),
        "join_points": lambda: rng.random((1_000_000, 2), dtype=np.float32),
        "gpu_base": lambda: rng.standard_normal((1_000_000, 128), dtype=np.float32),
        "gpu_queries": lambda: rng.standard_normal((10_000, 128), dtype=np.float32),
    }
    for name, make in files.items():
        if name.split("_")[0] not in groups:
            continue
        path = os.path.join(directory, f"{name}.npy")
        if not os.path.exists(path):
            np.save(path, make())


# P1 with torch from the same numpy arrays, host-to-device copies included (TF32: whether matmuls may
# use TF32).
TORCH = """
    import numpy as np, torch
    torch.backends.cuda.matmul.allow_tf32 = TF32
    base, queries = np.load(D + "/gpu_base.npy"), np.load(D + "/gpu_queries.npy")
    t = time.perf_counter()
    b, q = torch.from_numpy(base).cuda(), torch.from_numpy(queries).cuda()
    ids = torch.cat([torch.cdist(q[i:i + 1000], b).topk(10, largest=False).indices for i in range(0, len(q), 1000)])
    ids = ids.cpu().numpy()
    print(ids.size, time.perf_counter() - t)
"""

# Each peer: the code of one process. It prints the number of results and the seconds of the call.
PROGRAMS = {
    "knn": {
        "simjoin.knn (cpu)": """
            import numpy as np, simjoin
            base, queries = np.load(D + "/knn_base.npy"), np.load(D + "/knn_queries.npy")
            t = time.perf_counter(); distances, ids = simjoin.knn(base, queries, 10, device="cpu")
            print((ids >= 0).sum(), time.perf_counter() - t)
        """,
        "faiss-cpu IndexFlatL2": """
            import numpy as np, faiss
            base, queries = np.load(D + "/knn_base.npy"), np.load(D + "/knn_queries.npy")
            t = time.perf_counter(); index = faiss.IndexFlatL2(base.shape[1]); index.add(base)
            distances, ids = index.search(queries, 10)
            print((ids >= 0).sum(), time.perf_counter() - t)
        """,
        "scikit-learn NearestNeighbors": """
            import numpy as np
            from sklearn.neighbors import NearestNeighbors
            base, queries = np.load(D + "/knn_base.npy"), np.load(D + "/knn_queries.npy")
            t = time.perf_counter()
            distances, ids = NearestNeighbors(n_neighbors=10, n_jobs=-1).fit(base).kneighbors(queries)
            print(ids.size, time.perf_counter() - t)
        """,
    },
    "join": {
        "simjoin.sim_join (cpu)": """
            import numpy as np, simjoin
            points = np.load(D + "/join_points.npy")
            eps = math.sqrt(100 / (math.pi * len(points)))
            t = time.perf_counter(); pairs = simjoin.sim_join(points, eps, pairs="unordered", device="cpu")
            print(len(pairs.left), time.perf_counter() - t)
        """,
        "scipy cKDTree.query_pairs": """
            import numpy as np
            from scipy.spatial import cKDTree
            points = np.load(D + "/join_points.npy")
            eps = math.sqrt(100 / (math.pi * len(points)))
            t = time.perf_counter(); pairs = cKDTree(points).query_pairs(eps, output_type="ndarray")
            print(len(pairs), time.perf_counter() - t)
        """,
    },
    "text": {
        "simjoin.range_query (levenshtein)": """
            import simjoin
            words = [w.strip() for w in open(WORDS, encoding="utf-8") if w.strip()]
            queries = words[::100]
            t = time.perf_counter(); pairs = simjoin.range_query(words, queries, 2, metric="levenshtein")
            print(len(pairs.left), time.perf_counter() - t)
        """,
        "RapidFuzz cdist(score_cutoff=2)": """
            import numpy as np
            from rapidfuzz.distance import Levenshtein
            from rapidfuzz.process import cdist
            words = [w.strip() for w in open(WORDS, encoding="utf-8") if w.strip()]
            queries = words[::100]
            t = time.perf_counter()
            d = cdist(queries, words, scorer=Levenshtein.distance, score_cutoff=2, dtype=np.int32, workers=-1)
            print(int((d <= 2).sum()), time.perf_counter() - t)
        """,
    },
    "gpu": {
        "simjoin.knn (gpu)": """
            import numpy as np, simjoin
            base, queries = np.load(D + "/gpu_base.npy"), np.load(D + "/gpu_queries.npy")
            t = time.perf_counter(); distances, ids = simjoin.knn(base, queries, 10, device="gpu")
            print((ids >= 0).sum(), time.perf_counter() - t)
        """,
        "torch cdist+topk (fp32)": TORCH.replace("TF32", "False"),
        "torch cdist+topk (tf32)": TORCH.replace("TF32", "True"),
    },
}


def run(directory, code):
    """One process: (its wall seconds, the results it counted, the seconds of its call)."""
    program = f"import math, time\nD = {directory!r}\nWORDS = {WORDS!r}\n" + textwrap.dedent(code)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"failed:\n{program}\n{done.stderr}")
    results, call = done.stdout.split()
    return wall, int(results), float(call)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default="/tmp/simjoin-pybench")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="knn,join,text", help="comma-separated: knn, join, text, gpu")
    args = parser.parse_args()
    groups = args.only.split(",")
    prepare(args.dir, groups)
    rows = []
    for group in groups:
        peers = PROGRAMS[group]
        timings = {name: [run(args.dir, code) for _ in range(args.repeat)] for name, code in peers.items()}
        ours, *others = peers
        mine = statistics.median(t[0] for t in timings[ours])
        for name in peers:
            walls = [t[0] for t in timings[name]]
            calls = [t[2] for t in timings[name]]
            median = statistics.median(walls)
            same = timings[name][0][1] == timings[ours][0][1]
            ratio = "" if name == ours else f"{median / mine:.2f}×"
            rows.append((group, name, timings[name][0][1], min(walls), median, statistics.median(calls), ratio, same))
    print(f"{'workload':<6} {'program':<36} {'results':>10} {'min s':>7} {'median s':>9} {'call s':>7} {'simjoin faster':>14} same count")
    for group, name, results, low, median, call, ratio, same in rows:
        print(f"{group:<6} {name:<36} {results:>10,} {low:>7.3f} {median:>9.3f} {call:>7.3f} {ratio:>14} {'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
