"""simjoin in Python: exact similarity joins, range queries and k-nearest-neighbour searches.

Three ways in, one engine (the Rust library, in this process; its GPU where there is one):

- ``simjoin.knn``, ``simjoin.range_query``, ``simjoin.sim_join`` and ``simjoin.dbscan`` take numpy
  arrays, pyarrow arrays, lists of strings or of token lists and return numpy arrays (or a pyarrow
  Table);
- ``simjoin.SessionContext()`` runs SQL (``knn(base, queries, 10)``, ``JOIN … ON l2_distance(…) <= r``)
  over tables registered from Parquet, CSV, pyarrow, pandas, polars or numpy;
- ``simjoin.register(ctx)`` adds the table and distance functions to a datafusion-python 55
  ``SessionContext``.

Answers equal an f64 brute force on every device; ``approx=True`` (kNN alone) is the one exception.
"""

from ._simjoin import GPU
from .arrays import Neighbours, Pairs, dbscan, knn, range_query, sim_join
from .datafusion_extension import register
from .session import SessionContext, connect

__all__ = [
    "GPU",
    "Neighbours",
    "Pairs",
    "SessionContext",
    "connect",
    "dbscan",
    "knn",
    "range_query",
    "register",
    "sim_join",
]
