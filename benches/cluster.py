#!/usr/bin/env python3
"""The cluster against one process, each query as a user runs it: a new `simjoin sql` process
over Parquet files, once in-process and once with `--cluster` (a `simjoin scheduler` and
`simjoin executor`s on loopback, started here). Prints one table; best of --repeat runs after
one warm-up run (which compiles or loads the GPU kernels).

  python3 benches/cluster.py                      # build machine: 1M x 8 self-join, 100k x 128 kNN, CPU
  python3 benches/cluster.py --gpus 2             # one executor per GPU (CUDA_VISIBLE_DEVICES), 1 vs 2
                                                  # executors: kNN 100k queries over 10M x 128, 1M x 32 self-join
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from processes import SIMJOIN, start  # noqa: E402


def gen(path, n, d, seed, distribution="uniform"):
    if not os.path.exists(path):
        subprocess.run([SIMJOIN, "gen", path, "-n", str(n), "-d", str(d), "--seed", str(seed),
                        "--distribution", distribution], check=True, capture_output=True)


def timed(query, tables, cluster=None, settings="", repeat=3):
    """Best wall time of `simjoin sql` (after one warm-up run) and the answer's first row."""
    args = [SIMJOIN, "sql", "--format", "csv"]
    for name, path in tables.items():
        args += ["--table", f"{name}={path}"]
    if cluster:
        args += ["--cluster", cluster]
    best, out = None, ""
    for i in range(repeat + 1):
        started = time.time()
        run = subprocess.run(args + [settings + query], capture_output=True, text=True)
        elapsed = time.time() - started
        if run.returncode != 0:
            sys.exit(f"{query}: {run.stderr[-2000:]}")
        out = run.stdout.splitlines()[-1]
        if i > 0:
            best = elapsed if best is None else min(best, elapsed)
    return best, out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="bench-out/cluster")
    parser.add_argument("--gpus", type=int, default=0, help="one executor per GPU; 0: CPU executors")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="run the workloads whose name matches this regular expression")
    a = parser.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    p = lambda name: os.path.join(a.dir, name)
    if a.gpus:
        files = [("base", "base-10m-128.parquet", 10_000_000, 128, 1, "gaussian"),
                 ("queries", "queries-100k-128.parquet", 100_000, 128, 2, "gaussian"),
                 ("points", "points-1m-32.parquet", 1_000_000, 32, 3, "uniform"),
                 ("base1m", "base-1m-128.parquet", 1_000_000, 128, 4, "gaussian"),
                 ("queries1m", "queries-1m-128.parquet", 1_000_000, 128, 5, "gaussian")]
        workloads = [("kNN 100k queries, 10M x 128 base, k=10", "SELECT count(*) FROM knn(base, queries, 10)"),
                     ("kNN 1M queries, 1M x 128 base, k=10", "SELECT count(*) FROM knn(base1m, queries1m, 10)"),
                     ("kNN 1M queries, 10M x 128 base, k=10", "SELECT count(*) FROM knn(base, queries1m, 10)"),
                     ("self-join 1M x 32, eps=1.28 (~20 neighbours)", "SELECT count(*) FROM sim_join(points, 1.28)")]
        workloads = [w for w in workloads if re.search(a.only, w[0])]
        tables = {}
        for name, file, n, d, seed, distribution in files:
            if any(re.search(rf"\b{name}\b", query) for _, query in workloads):
                gen(p(file), n, d, seed, distribution)
                tables[name] = p(file)
        layouts = [1, a.gpus]
        device = "gpu"
    else:
        gen(p("points-1m-8.parquet"), 1_000_000, 8, 3)
        gen(p("base-100k-128.parquet"), 100_000, 128, 1, "gaussian")
        gen(p("queries-1k-128.parquet"), 1_000, 128, 2, "gaussian")
        tables = {"points": p("points-1m-8.parquet"), "base": p("base-100k-128.parquet"),
                  "queries": p("queries-1k-128.parquet")}
        workloads = [("self-join 1M x 8, eps=0.12", "SELECT count(*) FROM sim_join(points, 0.12)"),
                     ("kNN 1k queries, 100k x 128 base, k=10", "SELECT count(*) FROM knn(base, queries, 10)")]
        layouts = [1]
        device = "cpu"

    print(f"| workload | run | seconds (whole process, best of {a.repeat}) | answer | vs one process |")
    print("|---|---|---|---|---|", flush=True)
    row = lambda name, label, took, answer, ratio: print(
        f"| {name} | {label} | {took:.2f} | {answer} | {ratio:.2f}x |", flush=True)
    for name, query in workloads:
        local, answer = timed(query, tables, repeat=a.repeat)
        row(name, "one process", local, answer, 1.0)
        for executors in layouts:
            scheduler, address = start(["scheduler", "--bind", "127.0.0.1:0"])
            procs = []
            for e in range(executors):
                env = dict(os.environ)
                args = ["executor", "--scheduler", address, "--bind", "127.0.0.1:0", "--device", device]
                if a.gpus:
                    env["CUDA_VISIBLE_DEVICES"] = str(e)
                procs.append(start(args, env)[0])
            try:
                tasks = executors if a.gpus else os.cpu_count()
                settings = f"SET simjoin.tasks = {tasks}; "
                took, got = timed(query, tables, f"df://{address}", settings, a.repeat)
            finally:
                for proc in procs + [scheduler]:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=60)
            label = f"cluster, {executors} executor{'s' if executors > 1 else ''}, {tasks} tasks"
            row(name, label, took, got, local / took)
            if got != answer:
                sys.exit(f"{name}: the cluster answered {got}, one process {answer}")


if __name__ == "__main__":
    main()
