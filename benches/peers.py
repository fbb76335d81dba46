#!/usr/bin/env python3
"""Run the peers a user would pick instead of simjoin on the workloads `simjoin bench` wrote.

Reads DIR/simjoin.json (written by `simjoin bench --dir DIR`), runs each peer on the same Parquet
files with the same threshold or k, checks that it returns the same number of results, and writes
DIR/peers.json. Peers: SciPy cKDTree.query_pairs (ε self-join), scikit-learn NearestNeighbors
(radius and kNN), faiss-cpu IndexFlatL2 (kNN and range_search), DuckDB (SQL kNN over the same
Parquet file). A peer whose estimated time exceeds --budget seconds is skipped and said so.
For a workload whose pairs simjoin wrote to Parquet, the floor: pyarrow writing the same table with
the same codec on the same cores.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import pyarrow.parquet as pq


def load(path):
    table = pq.read_table(path)
    column = table.column("vector").combine_chunks()
    dim = column.type.list_size
    return np.asarray(column.flatten().to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)


def pyarrow_write_floor(path):
    """Seconds pyarrow takes to write the table simjoin wrote to `path`, with the codec simjoin's
    file has (pyarrow's default level for it) and its row group size, on every core: the floor of
    writing those rows to Parquet."""
    metadata = pq.ParquetFile(path).metadata
    codec = metadata.row_group(0).column(0).compression if metadata.num_row_groups else "NONE"
    rows_per_group = max(metadata.row_group(0).num_rows, 1) if metadata.num_row_groups else None
    table = pq.read_table(path)
    target = path + ".pyarrow"
    seconds, _ = timed(lambda: pq.write_table(table, target, compression=codec.lower(), row_group_size=rows_per_group))
    os.remove(target)
    return seconds


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def ckdtree_pairs(base, eps):
    from scipy.spatial import cKDTree

    def run():
        tree = cKDTree(base.astype(np.float64))
        return len(tree.query_pairs(eps, output_type="ndarray"))

    return timed(run)


def sklearn_radius_pairs(base, eps):
    from sklearn.neighbors import NearestNeighbors

    def run():
        nn = NearestNeighbors(radius=eps, algorithm="kd_tree", n_jobs=-1).fit(base.astype(np.float64))
        neighbours = nn.radius_neighbors(base.astype(np.float64), return_distance=False)
        return (sum(len(n) for n in neighbours) - len(base)) // 2

    return timed(run)


def faiss_knn(base, queries, k):
    import faiss

    def run():
        index = faiss.IndexFlatL2(base.shape[1])
        index.add(base)
        _, ids = index.search(queries, k)
        return int((ids >= 0).sum())

    return timed(run)


def faiss_range(base, queries, r):
    import faiss

    def run():
        index = faiss.IndexFlatL2(base.shape[1])
        index.add(base)
        # faiss compares squared L2 distances with the radius; widen by one f32 ulp-ish margin so
        # faiss's f32 rounding does not drop boundary pairs that the exact answer contains.
        lims, _, _ = index.range_search(queries, float(r) * float(r))
        return int(lims[-1])

    return timed(run)


def sklearn_knn(base, queries, k):
    from sklearn.neighbors import NearestNeighbors

    def run():
        nn = NearestNeighbors(n_neighbors=k, algorithm="brute", n_jobs=-1).fit(base)
        _, ids = nn.kneighbors(queries)
        return int(ids.size)

    return timed(run)


def duckdb_knn(base_path, query_path, k, dim):
    import duckdb

    def run():
        con = duckdb.connect()
        sql = f"""
            SELECT count(*) FROM (
              SELECT q.id, unnest(min_by(b.id, array_distance(b.vector::FLOAT[{dim}], q.vector::FLOAT[{dim}]), {k}))
              FROM read_parquet('{base_path}') b, read_parquet('{query_path}') q GROUP BY q.id)"""
        return con.execute(sql).fetchone()[0]

    return timed(run)


def plain_sql_self_join(eps):
    """The one SQL text both engines run: a plain join on DuckDB's and DataFusion's `array_distance`
    over a table `pts` (simjoin plans it as its ε-join, docs/sql.md "Plain SQL")."""
    return f"SELECT count(*) FROM pts a JOIN pts b ON array_distance(a.vector, b.vector) <= {eps!r} AND a.id < b.id"


def duckdb_self_join(path, eps, dim):
    import duckdb

    def run():
        con = duckdb.connect()
        # DuckDB's array_distance takes fixed-size arrays; DOUBLE keeps its arithmetic in f64.
        con.execute(f"CREATE VIEW pts AS SELECT id, vector::DOUBLE[{dim}] AS vector FROM read_parquet('{path}')")
        return con.execute(plain_sql_self_join(eps)).fetchone()[0]

    return timed(run)


def simjoin_cli_self_join(simjoin, path, eps):
    import subprocess

    def run():
        command = [simjoin, "sql", "--table", f"pts={path}", "--format", "csv", plain_sql_self_join(eps)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        return int(out.strip().splitlines()[-1])

    return timed(run)


def ckdtree_affordable(n, dim):
    """cKDTree within the time budget on 2 cores (from reference/perf.md and these runs)."""
    return dim <= 3 or (dim <= 8 and n <= 200_000) or (dim <= 16 and n <= 100_000)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="bench-out")
    parser.add_argument("--simjoin", default="target/release/simjoin", help="the simjoin binary, for the end-to-end SQL rows")
    parser.add_argument("--budget", type=float, default=120.0, help="skip a peer expected to take longer (s)")
    parser.add_argument("--only", default=None)
    args = parser.parse_args()
    workloads = json.load(open(os.path.join(args.dir, "simjoin.json")))
    results = []
    for w in workloads:
        if args.only and args.only not in w["name"]:
            continue
        output = w.get("output", "count")
        if output == "parquet":
            floor = pyarrow_write_floor(os.path.join(args.dir, w["output_file"]))
            print(f"{w['name']}: pyarrow write_table, the same table and codec: {floor:.3f} s", flush=True)
            results.append({"workload": w["name"], "peer": "pyarrow write_table (floor)", "seconds": floor,
                            "results": w["rows"], "simjoin_results": w["rows"], "simjoin_s": w["simjoin_s"]})
        if output != "count":
            # The count's peers answer the listed variants too.
            continue
        base_path = os.path.join(args.dir, w["base"])
        base = load(base_path)
        runs = []
        if w["kind"] == "self_join" and "sql-join" in w["name"]:
            runs.append(("DuckDB: the same SQL text (JOIN ON array_distance, Parquet file)", lambda: duckdb_self_join(base_path, w["threshold"], w["dim"])))
            runs.append(("simjoin sql CLI, the same SQL text (process start + Parquet read)", lambda: simjoin_cli_self_join(args.simjoin, base_path, w["threshold"])))
            expected = w["rows"]
        elif w["kind"] == "self_join":
            if ckdtree_affordable(len(base), w["dim"]):
                runs.append(("scipy cKDTree.query_pairs", lambda: ckdtree_pairs(base, w["threshold"])))
            if w["dim"] <= 3 and len(base) <= 1_000_000 and not w["name"].startswith("curve"):
                runs.append(("sklearn radius_neighbors (kd_tree)", lambda: sklearn_radius_pairs(base, w["threshold"])))
            expected = w["rows"]
        else:
            query_path = os.path.join(args.dir, w["queries"])
            queries = load(query_path)
            if w["kind"] == "knn":
                runs.append(("faiss-cpu IndexFlatL2", lambda: faiss_knn(base, queries, w["k"])))
                runs.append(("sklearn brute kNN", lambda: sklearn_knn(base, queries, w["k"])))
                if w["k"] == 10 and "gaussian" in w["name"]:
                    runs.append(("duckdb min_by(array_distance)", lambda: duckdb_knn(base_path, query_path, w["k"], w["dim"])))
            else:
                runs.append(("faiss-cpu range_search", lambda: faiss_range(base, queries, w["threshold"])))
            expected = w["rows"]
        for name, fn in runs:
            seconds, count = fn()
            same = count == expected
            print(f"{w['name']}: {name}: {seconds:.3f} s, {count} results ({'same as' if same else 'DIFFERENT from'} simjoin's {expected})", flush=True)
            results.append({"workload": w["name"], "peer": name, "seconds": seconds, "results": count, "simjoin_results": expected, "simjoin_s": w["simjoin_s"]})
    json.dump(results, open(os.path.join(args.dir, "peers.json"), "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
