"""simjoin's functions in a datafusion-python session.

The distance functions cross DataFusion's FFI as scalar UDF capsules. Each table function is a
Python table function of the session: it reads the tables its call names from the session (as
Arrow streams, whatever registered them), runs simjoin's function of the same name over them in
simjoin's engine, and hands the session the resulting table through the table-provider capsule,
which the session scans like any other (the engine then computes it, on its own threads).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable

import pyarrow as pa

from . import _simjoin

_NAMES = itertools.count()
_INTEGERS = {f"Int{b}": f"value_i{b}" for b in (8, 16, 32, 64)} | {f"UInt{b}": f"value_u{b}" for b in (8, 16, 32, 64)}
_TEXT = ("Utf8", "LargeUtf8", "Utf8View")


def _off_runtime(work: Callable[[], Any], what: str) -> Any:
    """``work()`` on a thread of its own. A table function is called on a thread of the session's
    runtime, where the session cannot start a query; a new thread can."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as error:  # raised again in the caller's thread
            result["error"] = error

    thread = threading.Thread(target=run, name=f"simjoin-{what}")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _argument(engine: Any, session: Any, function: str, position: int, arg: Any, inputs: list[str]) -> tuple[str, Any]:
    """One argument of a call as the (kind, value) pair the engine takes; a table of the session is
    read into the engine under a fresh name (added to ``inputs``)."""
    kind = arg.variant_name()
    variant = arg.to_variant()

    def table(name: str) -> tuple[str, str]:
        local = f"__simjoin_datafusion_{next(_NAMES)}"
        # Arrow data of the session's table: its buffers, not a copy.
        engine.register_stream(local, _off_runtime(lambda: pa.table(session.table(name)), f"read-{name}"))
        inputs.append(local)
        return ("table", local)

    if kind == "Column":
        return table(variant.qualified_name())
    if kind == "Literal":
        data_type = str(variant.data_type())
        if data_type in _TEXT:
            text = variant.value_string()
            return table(text) if session.table_exist(text) else ("text", text)
        if data_type in _INTEGERS:
            return ("integer", getattr(variant, _INTEGERS[data_type])())
        if data_type.startswith("Float"):
            return ("number", variant.value_f64() if data_type == "Float64" else float(variant.value_f32()))
        if "List" in data_type:
            from datafusion import Expr

            evaluated = _off_runtime(lambda: session.sql("SELECT 1").select(Expr(arg)).collect(), "literal")
            values = pa.Table.from_batches(evaluated).column(0)[0].as_py()
            if all(isinstance(v, str) for v in values):
                return ("strings", values)
            return ("floats", [float(v) for v in values])
    raise ValueError(
        f"{function}: argument {position}: expected a table, a number, a string or an array literal, "
        f"got {arg.canonical_name()}"
    )


def _table_function(engine: Any, function: str) -> Any:
    def call(*args: Any, session: Any) -> Any:
        inputs: list[str] = []
        try:
            arguments = [_argument(engine, session, function, i + 1, arg, inputs) for i, arg in enumerate(args)]
            return engine.table_function(function, arguments)
        finally:
            # The table keeps what it reads; the names are not needed again.
            for name in inputs:
                engine.deregister(name)

    call.__name__ = function
    return call


def register(ctx: Any) -> None:
    """Adds ``sim_join``, ``range_query``, ``knn`` and the distance functions (``l2_distance``,
    ``cosine_distance``, …) to the datafusion-python ``SessionContext`` ``ctx``, so
    ``ctx.sql("SELECT * FROM knn(base, queries, 10)")`` runs simjoin over its tables.

    Options go in the functions' options string (``knn(b, q, 10, 'metric=cosine')``): the session's
    ``SET simjoin.*``, the rewrite of a plain SQL join on a distance bound and the aggregate rule
    are the standalone :class:`simjoin.SessionContext`'s alone. A table argument is read whole
    when the call is planned (a filter on it in the query applies to the result, with the same
    answer).

    Raises ``ImportError`` when datafusion-python is missing or of another major version than the
    one whose FFI these functions speak.
    """
    expected = _simjoin.DATAFUSION_MAJOR
    try:
        import datafusion
    except ImportError as error:
        raise ImportError(
            f"simjoin.register needs datafusion-python {expected} (pip install 'datafusion=={expected}.*')"
        ) from error
    version = getattr(datafusion, "__version__", "unknown")
    if version.split(".")[0] != str(expected):
        raise ImportError(
            f"simjoin.register: this simjoin is built for datafusion-python {expected}, "
            f"but datafusion {version} is installed (pip install 'datafusion=={expected}.*')"
        )
    if not isinstance(ctx, datafusion.SessionContext):
        raise TypeError(f"simjoin.register: argument 'ctx': expected a datafusion.SessionContext, got {type(ctx).__name__}")
    engine = _simjoin.Session()
    for name in _simjoin.table_function_names():
        ctx.register_udtf(datafusion.udtf(_table_function(engine, name), name, with_session=True))
    for function in _simjoin.distance_functions():
        ctx.register_udf(datafusion.udf(function))
