"""The standalone session: the engine with everything the CLI has, from Python."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from . import _simjoin


def _sql_text(value: Any) -> str:
    """`value` as the text of a SQL string literal (booleans as true/false)."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    return str(value).replace("'", "''")


class SessionContext:
    """A session of the engine with simjoin's functions, options and optimizer rules.

    Options are keyword arguments (``SessionContext(device="gpu", cache_size="4G")``, the
    ``simjoin.*`` options without their prefix; DataFusion's own by their full name, e.g.
    ``**{"datafusion.execution.target_partitions": 4}``) or ``SET`` statements.
    """

    def __init__(self, **options: Any) -> None:
        self._session = _simjoin.Session()
        for key, value in options.items():
            self.set(key, value)

    def set(self, key: str, value: Any) -> None:
        """``SET simjoin.<key> = value`` (a key with a dot is taken as the full option name)."""
        name = key if "." in key else f"simjoin.{key}"
        self._session.sql(f"SET {name} = '{_sql_text(value)}'")

    def sql(self, query: str, *, stream: bool = False) -> pa.Table | pa.RecordBatchReader:
        """Runs ``query``: a ``pyarrow.Table`` of the whole result, or with ``stream=True`` a
        ``pyarrow.RecordBatchReader`` that computes each batch as it is read. The GIL is released
        while the engine works; Ctrl-C cancels the query. Errors in the query, an argument or an
        option raise ``ValueError`` with the engine's message."""
        if stream:
            return self._session.sql_stream(query)
        return self._session.sql(query).read_all()

    def register(self, name: str, data: Any) -> None:
        """Registers ``data`` as the table ``name`` (replacing one of that name):

        - a numpy 2-D array: columns ``id`` (the row number) and ``vector`` (each row a vector);
        - a list or 1-D array of strings: columns ``id`` and ``text``;
        - anything exporting ``__arrow_c_stream__`` or ``__arrow_c_array__`` (pyarrow Table,
          RecordBatch or RecordBatchReader, polars and pandas DataFrames), or a pandas DataFrame.

        Numeric arrays in C order and Arrow data are read where they lie, without a copy.
        """
        self._session.register_stream(name, as_arrow_stream(data, "register", name))

    def register_parquet(self, name: str, path: str) -> None:
        """Registers the Parquet file or directory at ``path`` as the table ``name``."""
        self._session.register_parquet(name, str(path))

    def register_csv(self, name: str, path: str) -> None:
        """Registers the CSV file at ``path`` (with a header row) as the table ``name``."""
        self._session.register_csv(name, str(path))

    def deregister(self, name: str) -> bool:
        """Removes the table ``name``; ``True`` when there was one."""
        return self._session.deregister(name)


def connect(**options: Any) -> SessionContext:
    """A new :class:`SessionContext` with ``options``."""
    return SessionContext(**options)


def vector_table(array: np.ndarray, function: str, argument: str) -> pa.Table:
    """A numpy 2-D numeric array as a table of ``id`` and ``vector`` (a FixedSizeList column over
    the array's own buffer when it is C-contiguous in native byte order)."""
    if array.ndim != 2:
        raise ValueError(
            f"{function}: argument '{argument}': expected a 2-D array (rows × dimensions), "
            f"got {array.ndim} dimension(s) of shape {array.shape}"
        )
    if array.dtype.kind not in "fiu" or array.dtype.itemsize > 8:
        raise ValueError(
            f"{function}: argument '{argument}': expected a float or integer array, got dtype {array.dtype}"
        )
    rows, dims = array.shape
    if dims == 0:
        raise ValueError(f"{function}: argument '{argument}': vectors need at least one dimension, got shape {array.shape}")
    # A NaN makes the sum NaN (so does +inf with -inf: the rows are then searched, finding none).
    # The sum reads the array once without a temporary of its size.
    if array.dtype.kind == "f" and rows and np.isnan(array.sum(dtype=np.float64)):
        for start in range(0, rows, 65536):
            block = np.isnan(array[start : start + 65536]).any(axis=1)
            if block.any():
                row = start + int(block.argmax())
                raise ValueError(f"{function}: argument '{argument}': row {row} contains NaN")
    # C order and native byte order are what an Arrow list of values is; other layouts copy once.
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
    vectors = pa.FixedSizeListArray.from_arrays(_numpy_view(array.reshape(-1)), dims)
    return pa.table({"id": _numpy_view(np.arange(rows, dtype=np.int64)), "vector": vectors})


def _numpy_view(values: np.ndarray) -> pa.Array:
    """A contiguous 1-D numeric array as an Arrow array over the same buffer. (``pa.array`` would
    do the same but imports pandas on its first call, a quarter of a second of a short process.)"""
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])


def text_table(strings: Any, function: str, argument: str) -> pa.Table:
    """Strings as a table of ``id`` and ``text``."""
    text = pa.array(strings, type=pa.large_string()) if not isinstance(strings, pa.Array) else strings
    if not pa.types.is_string(text.type) and not pa.types.is_large_string(text.type) and not pa.types.is_string_view(text.type):
        raise ValueError(f"{function}: argument '{argument}': expected strings, got {text.type}")
    return pa.table({"id": _numpy_view(np.arange(len(text), dtype=np.int64)), "text": text})


def as_arrow_stream(data: Any, function: str, argument: str) -> Any:
    """``data`` as an object with ``__arrow_c_stream__``, converting what needs converting."""
    if isinstance(data, np.ndarray):
        if data.dtype.kind in "OUST":
            return text_table(data.tolist(), function, argument)
        return vector_table(data, function, argument)
    if isinstance(data, (list, tuple)):
        if all(isinstance(item, str) for item in data):
            return text_table(list(data), function, argument)
        try:
            rows = np.asarray(data)
        except ValueError as error:
            raise ValueError(f"{function}: argument '{argument}': rows of different lengths ({error})") from None
        if rows.dtype == object:
            raise ValueError(f"{function}: argument '{argument}': rows of different lengths or types")
        return vector_table(rows, function, argument)
    if hasattr(data, "__arrow_c_stream__"):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_string(data.type) or pa.types.is_large_string(data.type):
            return text_table(data, function, argument)
        return pa.table({"id": _numpy_view(np.arange(len(data), dtype=np.int64)), "vector": data})
    if hasattr(data, "__arrow_c_array__"):
        return pa.table(data)
    try:
        import pandas

        if isinstance(data, pandas.DataFrame):
            return pa.Table.from_pandas(data, preserve_index=False)
    except ImportError:
        pass
    raise ValueError(
        f"{function}: argument '{argument}': cannot read a {type(data).__name__} "
        "(expected a numpy array, a list of strings, or Arrow data: pyarrow, polars, pandas)"
    )
