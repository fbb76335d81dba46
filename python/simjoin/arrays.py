"""``knn``, ``range_query`` and ``sim_join`` over numpy arrays, Arrow arrays or lists of strings.

Each call registers its inputs in a session (without copying them), runs the table function of the
same name and reads its result into numpy arrays. Row numbers are positions in the inputs.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from .session import SessionContext, _numpy_view, _sql_text, as_arrow_stream, vector_table


class Neighbours(NamedTuple):
    """kNN's answer, as faiss gives it: ``distances`` and ``ids`` are ``(n_queries, k)`` matrices,
    each row ranked nearest first (ties by base row); a query with fewer than ``k`` base rows has
    ``inf`` and ``-1`` in the rest."""

    distances: np.ndarray
    ids: np.ndarray


class Pairs(NamedTuple):
    """A range query's or a join's answer: one entry per pair, in no set order (as the engine's
    threads find them), or with ``sort=True`` ordered by left (query) row, then right (base) row.
    Unsorted, the arrays are read-only views of the engine's result (``.copy()`` to change them)."""

    left: np.ndarray
    right: np.ndarray
    distances: np.ndarray


_DEFAULT: SessionContext | None = None
_DEFAULT_LOCK = threading.Lock()
_NAMES = itertools.count()


def _session(session: SessionContext | None) -> SessionContext:
    """``session``, or the process's default one (made on first use)."""
    global _DEFAULT
    if session is not None:
        return session
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = SessionContext()
        return _DEFAULT


def _sets_or_bits(data: Any, function: str, argument: str, metric: str) -> Any:
    """One input of ``metric='jaccard'`` or ``'hamming'`` as Arrow data: a list of token lists is a
    set column ``set``; a numpy ``uint8`` array (rows × bytes) a FixedSizeBinary column ``bits`` over
    the array's own buffer; a 1-D ``uint64``/``int64`` array one 64-bit hash a row (``bits``), a 2-D
    one several words a row (as bytes, in the array's order). Arrow data goes as it is (name its
    column with ``column=``). ``None`` where ``data`` is none of these."""
    if isinstance(data, np.ndarray):
        if data.dtype.kind not in "iu":
            raise ValueError(
                f"{function}: argument '{argument}': metric={metric} compares bit strings (uint8 bytes, or uint64 "
                f"hashes) or sets (lists of tokens), got a numpy array of dtype {data.dtype}"
            )
        array = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("="))
        rows = array.shape[0] if array.ndim else 0
        if array.ndim == 1 and array.dtype.itemsize == 8:
            bits = _numpy_view(array)
        elif array.ndim == 2:
            width = array.shape[1] * array.dtype.itemsize
            buffer = pa.py_buffer(array.view(np.uint8).reshape(-1))
            bits = pa.Array.from_buffers(pa.binary(width), rows, [None, buffer])
        else:
            raise ValueError(
                f"{function}: argument '{argument}': expected a 2-D array of bytes or words (rows × width), "
                f"or a 1-D array of 64-bit hashes, got shape {array.shape} of {array.dtype}"
            )
        return pa.table({"id": _numpy_view(np.arange(rows, dtype=np.int64)), "bits": bits})
    if isinstance(data, (list, tuple)) and all(isinstance(row, (list, tuple, set, frozenset)) for row in data):
        rows = [list(row) for row in data]
        try:
            sets = pa.array(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise ValueError(f"{function}: argument '{argument}': sets of tokens of mixed types ({error})") from None
        if pa.types.is_null(sets.type.value_type):
            sets = pa.array(rows, type=pa.list_(pa.string()))
        return pa.table({"id": _numpy_view(np.arange(len(rows), dtype=np.int64)), "set": sets})
    return None


def _input(data: Any, function: str, argument: str, text: bool) -> Any:
    """One input as Arrow data the engine reads: vectors or (for ``metric='levenshtein'``) strings."""
    if text:
        if isinstance(data, (list, tuple, np.ndarray)) and not all(isinstance(s, str) for s in data):
            raise ValueError(f"{function}: argument '{argument}': metric=levenshtein needs strings")
        return as_arrow_stream(list(data) if isinstance(data, np.ndarray) else data, function, argument)
    if isinstance(data, np.ndarray):
        return vector_table(data, function, argument)
    return as_arrow_stream(data, function, argument)


def _rows(table: Any) -> int:
    return table.num_rows if hasattr(table, "num_rows") else len(table)


def _options(function: str, options: dict[str, Any]) -> str:
    """The options string of a table function call (``'metric=l2, device=auto'``)."""
    parts = []
    for key, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        text = str(value)
        if "," in text or "=" in text:
            raise ValueError(f"{function}: option '{key}': value {text!r} may not contain ',' or '='")
        parts.append(f"{key}={text}")
    return _sql_text(", ".join(parts))


def _run(session: SessionContext, inputs: list[Any], sql: str) -> pa.Table:
    """Registers ``inputs`` under fresh names, runs ``sql`` (``{0}``, ``{1}``: their names), and
    removes them again."""
    names = [f"__simjoin_input_{next(_NAMES)}" for _ in inputs]
    try:
        for name, data in zip(names, inputs):
            session._session.register_stream(name, data)
        # One buffer per column, so that numpy views each without a copy.
        return session._session.sql_contiguous(sql.format(*names)).read_all()
    finally:
        for name in names:
            session.deregister(name)


def _inputs(function: str, data: list[tuple[str, Any]], metric: str, options: dict[str, Any]) -> list[Any]:
    """The inputs of a call as Arrow data; under ``metric='jaccard'`` or ``'hamming'``, sets and bits
    converted here are read from the column they were given (``column=set`` or ``column=bits``)."""
    if metric in ("jaccard", "hamming"):
        converted = [_sets_or_bits(value, function, argument, metric) for argument, value in data]
        columns = {t.column_names[1] for t in converted if t is not None}
        if len(columns) > 1:
            raise ValueError(f"{function}: a set and a bit string do not compare ({', '.join(sorted(columns))})")
        if columns and all(t is not None for t in converted) and "column" not in options:
            options["column"] = columns.pop()
        return [t if t is not None else as_arrow_stream(value, function, argument) for t, (argument, value) in zip(converted, data)]
    text = metric == "levenshtein"
    return [_input(value, function, argument, text) for argument, value in data]


def _base_and_queries(function: str, base: Any, queries: Any, metric: str, options: dict[str, Any]) -> tuple[Any, Any]:
    base_data, query_data = _inputs(function, [("base", base), ("queries", queries)], metric, options)
    return base_data, query_data


def _check_count(function: str, argument: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{function}: argument '{argument}': expected an integer ≥ 1, got {value!r}")
    return int(value)


def _check_threshold(function: str, argument: str, value: Any) -> float:
    try:
        threshold = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{function}: argument '{argument}': expected a number, got {value!r}") from None
    if np.isnan(threshold):
        raise ValueError(f"{function}: argument '{argument}': expected a number, got NaN")
    return threshold


def knn(
    base: Any,
    queries: Any,
    k: int,
    *,
    metric: str = "l2",
    device: str = "auto",
    approx: bool = False,
    output: str = "numpy",
    session: SessionContext | None = None,
    **options: Any,
) -> Neighbours | pa.Table:
    """The ``k`` nearest rows of ``base`` to each row of ``queries``.

    ``base`` and ``queries`` are numpy 2-D arrays (any float or integer dtype), pyarrow list arrays,
    Arrow tables with one vector column, with ``metric="levenshtein"`` lists of strings, with
    ``metric="jaccard"`` lists of token lists (sets), and with ``metric="hamming"`` (or
    ``"jaccard"``: Tanimoto) bit strings as numpy ``uint8`` rows of bytes or ``uint64`` hashes.
    ``metric`` is l2 (not squared; ``l2sq`` is), l2sq, cosine, inner_product, l1, linf,
    levenshtein, jaccard or hamming; ``device`` auto, cpu or gpu; ``approx=True`` searches the Multicurves index to
    recall@k 0.95 (``approx_recall=…`` another target, ``approx_effort=…`` a fixed effort). Further ``simjoin.*`` options are keyword arguments.

    Returns :class:`Neighbours` ``(distances, ids)`` as ``(n_queries, k)`` matrices, or with
    ``output="arrow"`` the table ``query_id, base_id, distance, rank``.
    """
    k = _check_count("knn", "k", k)
    base_data, query_data = _base_and_queries("knn", base, queries, metric, options)
    settings = _options("knn", {"metric": metric, "device": device, "approx": approx or None, **options})
    table = _run(
        _session(session),
        [base_data, query_data],
        f"SELECT query_id, base_id, distance, rank FROM knn({{0}}, {{1}}, {k}, '{settings}')",
    )
    if output == "arrow":
        return table
    count = _rows(query_data)
    distances = np.full((count, k), np.inf)
    ids = np.full((count, k), -1, dtype=np.int64)
    rows = _column(table, "query_id")
    ranks = _column(table, "rank") - 1
    distances[rows, ranks] = _column(table, "distance")
    ids[rows, ranks] = _column(table, "base_id")
    return Neighbours(distances, ids)


def _column(table: pa.Table, name: str) -> np.ndarray:
    """A result column as numpy: a read-only view of the engine's buffer (one chunk, no NULLs).
    Viewed by numpy directly: pyarrow's ``to_numpy`` imports pandas on its first call, a quarter of
    a second of a short process."""
    column = table.column(name)
    values = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if values.null_count or not pa.types.is_primitive(values.type) or pa.types.is_boolean(values.type):
        return values.to_numpy(zero_copy_only=False)
    dtype = np.dtype(values.type.to_pandas_dtype())
    return np.frombuffer(values.buffers()[1], dtype=dtype, count=len(values), offset=values.offset * dtype.itemsize)


def _pairs(table: pa.Table, left: str, right: str, output: str, sort: bool) -> Pairs | pa.Table:
    if output == "arrow":
        return table
    pairs = Pairs(_column(table, left), _column(table, right), _column(table, "distance"))
    if not sort:
        return pairs
    order = np.lexsort((pairs.right, pairs.left))
    return Pairs(pairs.left[order], pairs.right[order], pairs.distances[order])


def range_query(
    base: Any,
    queries: Any,
    r: float,
    *,
    metric: str = "l2",
    device: str = "auto",
    sort: bool = False,
    output: str = "numpy",
    session: SessionContext | None = None,
    **options: Any,
) -> Pairs | pa.Table:
    """Every (query row, base row) pair within distance ``r`` (inclusive). Arguments as
    :func:`knn`; ``sort=True`` orders the pairs. Returns :class:`Pairs` ``(left=query rows,
    right=base rows, distances)``, or with ``output="arrow"`` the table ``query_id, base_id,
    distance``."""
    r = _check_threshold("range_query", "r", r)
    base_data, query_data = _base_and_queries("range_query", base, queries, metric, options)
    settings = _options("range_query", {"metric": metric, "device": device, **options})
    table = _run(
        _session(session),
        [base_data, query_data],
        f"SELECT query_id, base_id, distance FROM range_query({{0}}, {{1}}, {r!r}, '{settings}')",
    )
    return _pairs(table, "query_id", "base_id", output, sort)


def sim_join(
    a: Any,
    eps: float,
    b: Any = None,
    *,
    metric: str = "l2",
    device: str = "auto",
    pairs: str = "ordered",
    sort: bool = False,
    output: str = "numpy",
    session: SessionContext | None = None,
    **options: Any,
) -> Pairs | pa.Table:
    """Every pair of rows within distance ``eps`` (inclusive): of ``a`` with itself, or of ``a``
    with ``b``. A self-join gives both (i, j) and (j, i) with ``pairs="ordered"``, each pair once
    (i < j) with ``pairs="unordered"``; a row with itself only with ``include_self=True``.
    Arguments as :func:`knn`; ``sort=True`` orders the pairs. Returns :class:`Pairs`
    ``(left, right, distances)``, or with
    ``output="arrow"`` the table ``left_id, right_id, distance``."""
    eps = _check_threshold("sim_join", "eps", eps)
    inputs = _inputs("sim_join", [("a", a)] + ([("b", b)] if b is not None else []), metric, options)
    settings = {"metric": metric, "device": device, **options}
    if b is None:
        settings["pairs"] = pairs
    tables = "{0}, {1}" if b is not None else "{0}"
    table = _run(
        _session(session),
        inputs,
        f"SELECT left_id, right_id, distance FROM sim_join({tables}, {eps!r}, '{_options('sim_join', settings)}')",
    )
    return _pairs(table, "left_id", "right_id", output, sort)


def dbscan(
    data: Any,
    eps: float,
    min_points: int = 5,
    *,
    metric: str = "l2",
    device: str = "auto",
    output: str = "numpy",
    session: SessionContext | None = None,
    **options: Any,
) -> np.ndarray | pa.Table:
    """DBSCAN of the rows of ``data`` (the inputs :func:`sim_join` takes: vectors, strings, sets or
    bits) over the ε-graph of ``metric``: a row with at least ``min_points`` rows within ``eps``
    (itself included, as scikit-learn counts) is a core row; core rows within ``eps`` of each other
    share a cluster; a row within ``eps`` of a core row takes its nearest core row's cluster; the rest
    are noise. ``min_points=1`` gives the connected components of the ε-graph.

    Returns the labels as scikit-learn's ``fit_predict`` does: an int64 array, one label a row,
    ``-1`` for noise, clusters numbered 0, 1, … in the order of their first core row. With
    ``output="arrow"``, the table ``id, cluster_id, core`` (``cluster_id`` the row of the cluster's
    first core row, NULL for noise)."""
    eps = _check_threshold("dbscan", "eps", eps)
    min_points = _check_count("dbscan", "min_points", min_points)
    inputs = _inputs("dbscan", [("data", data)], metric, options)
    settings = {"metric": metric, "device": device, **options}
    table = _run(
        _session(session),
        inputs,
        f"SELECT id, cluster_id, core FROM dbscan({{0}}, {eps!r}, {min_points}, '{_options('dbscan', settings)}') ORDER BY id",
    )
    if output == "arrow":
        return table
    roots = table.column("cluster_id").to_numpy(zero_copy_only=False)
    labels = np.full(len(roots), -1, dtype=np.int64)
    clustered = ~np.isnan(roots) if roots.dtype.kind == "f" else np.ones(len(roots), dtype=bool)
    if clustered.any():
        _, numbered = np.unique(roots[clustered].astype(np.int64), return_inverse=True)
        labels[clustered] = numbered
    return labels
