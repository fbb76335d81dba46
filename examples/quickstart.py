"""simjoin from Python in one page: kNN, a range query and a self-join over numpy arrays, then SQL
over a Parquet file written by pyarrow.

    pip install .            # from the repository: builds the wheel (a Rust toolchain, maturin)
    python examples/quickstart.py
"""

import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import simjoin

rng = np.random.default_rng(7)
base = rng.random((10_000, 64), dtype=np.float32)  # 10,000 vectors of 64 dimensions
queries = rng.random((5, 64), dtype=np.float32)  # 5 query vectors

# The 10 nearest base rows of each query, as faiss returns them: (n_queries, k) matrices.
distances, ids = simjoin.knn(base, queries, 10)
print("nearest of query 0:", ids[0][:3], distances[0][:3])

# Every base row within 2.9 of a query (L2, inclusive), as (query row, base row, distance) arrays.
pairs = simjoin.range_query(base, queries, 2.9)
print("range query pairs:", len(pairs.left))

# Every pair of 2-D points within 0.01 of each other, each pair once.
points = rng.random((20_000, 2))
pairs = simjoin.sim_join(points, 0.01, pairs="unordered")
print("self-join pairs:", len(pairs.left))

# SQL over files: the vector column is found by itself (the only list column), or named with
# 'column=embedding'.
folder = tempfile.mkdtemp()
docs = os.path.join(folder, "docs.parquet")
vectors = pa.FixedSizeListArray.from_arrays(pa.array(base.ravel()), 64)
pq.write_table(pa.table({"id": np.arange(len(base)), "embedding": vectors}), docs)
questions = os.path.join(folder, "questions.parquet")
pq.write_table(pa.table({"id": np.arange(5), "embedding": pa.FixedSizeListArray.from_arrays(pa.array(queries.ravel()), 64)}), questions)

session = simjoin.SessionContext()
table = session.sql(
    f"SELECT query_id, base_id, distance FROM knn('{docs}', '{questions}', 3, 'column=embedding') ORDER BY query_id, distance"
)
print(table.slice(0, 3).to_pydict())
assert table.column("base_id").to_pylist()[0] == ids[0][0], "SQL and the array API give the same nearest row"
