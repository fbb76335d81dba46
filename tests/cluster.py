#!/usr/bin/env python3
"""A cluster of separate processes on loopback: `simjoin scheduler`, two `simjoin executor`s.

Starts them (port 0: each prints where it listens), runs sim_join, range_query and knn with
`simjoin sql --cluster` over multi-file Parquet inputs made by `simjoin gen`, and checks each
answer against the same query in one process. Then the faults: a scheduler that is not there is
an error within a minute; an executor killed mid-query gives either the full answer (Ballista
retries its tasks on the other executor) or an error, within a bounded time, never a partial
answer reported as complete; SIGTERM stops every process. `simjoin serve --cluster` answers over
Flight SQL (ADBC) as one process does. Every wait is bounded. Run by .ci/run;
prints "N passed, N failed".
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from checks import Checks
from processes import SIMJOIN, start


def stop(proc, timeout=30):
    """SIGTERM, then the exit code (None if it did not stop within `timeout`)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


def sql(query, tables, cluster=None, timeout=300):
    """`simjoin sql --format json`: (exit code, sorted rows, stderr, seconds)."""
    args = [SIMJOIN, "sql", "--format", "json"]
    for name, path in tables.items():
        args += ["--table", f"{name}={path}"]
    if cluster:
        args += ["--cluster", cluster]
    started = time.time()
    run = subprocess.run(args + [query], capture_output=True, text=True, timeout=timeout)
    rows = sorted(json.dumps(json.loads(line), sort_keys=True) for line in run.stdout.splitlines() if line.strip())
    return run.returncode, rows, run.stderr, time.time() - started


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    checks = Checks()
    with tempfile.TemporaryDirectory() as tmp:
        for name, files, n, d in [("base", 3, 4000, 8), ("queries", 2, 300, 8), ("big", 2, 60000, 3)]:
            os.makedirs(os.path.join(tmp, name))
            for f in range(files):
                path = os.path.join(tmp, name, f"part-{f}.parquet")
                subprocess.run([SIMJOIN, "gen", path, "-n", str(n // files), "-d", str(d), "--seed", str(7 * f + len(name))],
                               check=True, capture_output=True)
        tables = {name: os.path.join(tmp, name) + "/" for name in ["base", "queries", "big"]}

        scheduler, address = start(["scheduler", "--bind", "127.0.0.1:0"])
        executors = [start(["executor", "--scheduler", address, "--bind", "127.0.0.1:0", "--device", "cpu",
                            "--concurrent-tasks", "2"])[0] for _ in range(2)]
        url = f"df://{address}"
        try:
            queries = [
                "SELECT left_id, right_id, distance FROM sim_join(base, 0.45)",
                "SELECT left_id, right_id, distance FROM sim_join(base, 0.45, 'pairs=unordered, include_self=true')",
                "SELECT left_id, right_id, distance FROM sim_join(queries, base, 0.5, 'metric=l1')",
                "SELECT query_id, base_id, distance FROM range_query(base, queries, 0.5)",
                "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 10)",
                "SELECT base_id, distance, rank FROM knn(base, '[0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5]', 5, 'metric=cosine')",
                "SELECT count(*) AS pairs FROM sim_join(big, 0.01)",
            ]
            for query in queries:
                want = sql(query, tables)
                got = sql(query, tables, cluster=url)
                checks.check(f"cluster: {query[:70]}", got[0] == 0 and got[1] == want[1] and len(want[1]) > 0,
                             f"rc={got[0]} rows={len(got[1])} want={len(want[1])} {got[2][-500:]}")

            # Flight SQL in front of the cluster: `simjoin serve --cluster`, queried over ADBC.
            import adbc_driver_flightsql.dbapi as flight_sql
            server, served = start(["serve", "--cluster", url, "--bind", "127.0.0.1:0",
                                    "--table", f"base={tables['base']}", "--table", f"queries={tables['queries']}"])
            try:
                with flight_sql.connect(served) as conn, conn.cursor() as cursor:
                    query = "SELECT query_id, base_id, distance, rank FROM knn(base, queries, 10)"
                    cursor.execute(query)
                    got = sorted(json.dumps(dict(zip(["query_id", "base_id", "distance", "rank"], row)), sort_keys=True)
                                 for row in cursor.fetchall())
                    want = sql(query, tables)[1]
                    checks.check("serve --cluster: knn over Flight SQL", got == want and len(want) > 0,
                                 f"rows={len(got)} want={len(want)}")
            finally:
                stop(server)

            # An executor killed mid-query: the whole answer or an error, in bounded time.
            query = "SELECT query_id, base_id, rank FROM knn(big, big, 5)"
            want = sql(query, tables)
            killer = threading.Timer(0.5, lambda: executors[1].kill())
            killer.start()
            try:
                got = sql(query, tables, cluster=url, timeout=240)
                outcome = "answer" if got[0] == 0 else "error"
                checks.check(f"executor killed mid-query: {outcome} in {got[3]:.0f} s",
                             (got[0] == 0 and got[1] == want[1]) or (got[0] != 0 and "error" in got[2]),
                             f"rc={got[0]} rows={len(got[1])} of {len(want[1])} {got[2][-500:]}")
            except subprocess.TimeoutExpired:
                checks.check("executor killed mid-query: bounded", False, "no answer or error within 240 s")
            killer.cancel()
        finally:
            codes = [stop(p) for p in executors] + [stop(scheduler)]
        checks.check("SIGTERM stops the scheduler and the executors", all(c is not None for c in codes), f"{codes}")

        # No scheduler at the URL: a clear error within a minute.
        port = free_port()
        started = time.time()
        got = sql("SELECT count(*) FROM sim_join(base, 0.1)", tables, cluster=f"df://127.0.0.1:{port}", timeout=120)
        checks.check(f"no scheduler: an error in {time.time() - started:.0f} s",
                     got[0] != 0 and time.time() - started < 60, got[2][-500:])
    print(f"{checks.passed} passed, {checks.failed} failed")
    sys.exit(1 if checks.failed else 0)


if __name__ == "__main__":
    main()
