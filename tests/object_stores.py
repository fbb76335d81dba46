#!/usr/bin/env python3
"""Object stores from `simjoin sql` and `simjoin serve` against a real S3-compatible server.

Starts moto's S3 server (moto[server] from PyPI) on loopback, uploads Parquet and CSV files made by
`simjoin gen`, and runs sim_join, range_query and knn over `s3://` URLs (credentials and endpoint
from the environment, as users give them) and over `http://` URLs of the same objects, checking
every answer against the same files read locally. Also checks that a missing bucket and an unknown
scheme are clear errors naming the URL, and that `simjoin serve` reads
the buckets of its --table URLs and refuses others. Run by .ci/run; prints "N passed, N failed".
"""
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile

import adbc_driver_flightsql.dbapi as flight_sql
import boto3
from moto.server import ThreadedMotoServer

from checks import Checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIMJOIN = os.environ.get("SIMJOIN") or os.path.join(ROOT, "target", "release", "simjoin")
BUCKET = "simjoin-data"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(args, env):
    """A `simjoin serve` process with `args`, stopped on leaving; yields its address."""
    proc = subprocess.Popen([SIMJOIN, "serve", "--bind", "127.0.0.1:0"] + args, stdout=subprocess.PIPE, text=True, env=env)
    try:
        yield proc.stdout.readline().split("://")[1].split()[0]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def sql(query, env):
    """`simjoin sql --format json` in a new process: (exit code, rows, stderr)."""
    run = subprocess.run([SIMJOIN, "sql", "--format", "json", query], capture_output=True, text=True, env=env)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    return run.returncode, rows, run.stderr


def main():
    checks = Checks()
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    # Credentials and endpoint from the environment, as a user of an S3-compatible store gives them.
    s3_env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
    }
    try:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        client.create_bucket(Bucket=BUCKET)
        with tempfile.TemporaryDirectory() as tmp:
            files = {
                "points.parquet": ["-n", "3000", "-d", "3"],
                "points.csv": ["-n", "3000", "-d", "3"],
                "queries.parquet": ["-n", "40", "-d", "3", "--seed", "7"],
                "queries.csv": ["-n", "40", "-d", "3", "--seed", "7"],
            }
            for name, args in files.items():
                path = os.path.join(tmp, name)
                subprocess.run([SIMJOIN, "gen", path] + args, check=True, capture_output=True)
                # Public objects, so that plain http:// reads them too.
                client.upload_file(path, BUCKET, f"data/{name}", ExtraArgs={"ACL": "public-read"})

            def local(name):
                return os.path.join(tmp, name)

            def s3(name):
                return f"s3://{BUCKET}/data/{name}"

            def http(name):
                return f"{endpoint}/{BUCKET}/data/{name}"

            queries = {
                "sim_join": "SELECT left_id, right_id, distance FROM sim_join('{p}', 0.05) ORDER BY left_id, right_id",
                "range_query": "SELECT query_id, base_id, distance FROM range_query('{p}', '{q}', 0.08) "
                "ORDER BY query_id, base_id",
                "knn": "SELECT query_id, base_id, distance, rank FROM knn('{p}', '{q}', 7) ORDER BY query_id, rank",
            }
            for ext in ["parquet", "csv"]:
                for function, template in queries.items():
                    expected_code, expected, err = sql(
                        template.format(p=local(f"points.{ext}"), q=local(f"queries.{ext}")), s3_env
                    )
                    checks.check(f"{function} over local {ext}", expected_code == 0 and len(expected) > 0, err)
                    for scheme, url in [("s3", s3), ("http", http)]:
                        code, rows, err = sql(template.format(p=url(f"points.{ext}"), q=url(f"queries.{ext}")), s3_env)
                        checks.check(f"{function} over {scheme}:// {ext} equals local", code == 0 and rows == expected, err)

            # Errors name the URL and never ask for a bug report.
            def clear_error(name, query, env, *needles):
                code, _, err = sql(query, env)
                # Not DataFusion's "likely caused by a bug … file a bug report" internal error (the
                # word alone can occur in a server's random request ids).
                ok = code != 0 and all(n in err for n in needles) and "caused by a bug" not in err.lower()
                checks.check(name, ok, err)

            clear_error(
                "missing bucket",
                "SELECT count(*) FROM sim_join('s3://no-such-bucket/points.parquet', 0.1)",
                s3_env,
                "s3://no-such-bucket/points.parquet",
            )
            clear_error(
                "unknown scheme",
                "SELECT count(*) FROM sim_join('ftp://host/points.parquet', 0.1)",
                s3_env,
                "ftp://host/points.parquet",
            )
            # simjoin serve: tables in the bucket, credentials from the environment.
            with serving(["--table", f"points={s3('points.parquet')}"], s3_env) as address:
                with flight_sql.connect(f"grpc://{address}") as conn:
                    with conn.cursor() as cursor:
                        cursor.execute("SELECT count(*) AS n FROM sim_join(points, 0.05)")
                        served = cursor.fetch_arrow_table().to_pylist()[0]["n"]
                    _, expected, _ = sql(f"SELECT count(*) AS n FROM sim_join('{local('points.parquet')}', 0.05)", s3_env)
                    checks.check("serve: a table in s3://", served == expected[0]["n"], f"{served} vs {expected}")
                    with conn.cursor() as cursor:
                        try:
                            cursor.execute(f"SELECT count(*) FROM sim_join('{s3('queries.parquet')}', 0.05)")
                            cursor.fetch_arrow_table()
                            checks.check("serve: a path in the served bucket", True)
                        except Exception as e:  # noqa: BLE001
                            checks.check("serve: a path in the served bucket", False, str(e))
                    with conn.cursor() as cursor:
                        try:
                            cursor.execute("SELECT count(*) FROM sim_join('s3://another-bucket/points.parquet', 0.05)")
                            cursor.fetch_arrow_table()
                            checks.check("serve: another bucket is refused", False, "no error")
                        except Exception as e:  # noqa: BLE001
                            message = str(e)
                            checks.check(
                                "serve: another bucket is refused",
                                "not reachable" in message and "another-bucket" in message,
                                message,
                            )
            # --data-dir with a URL opens that bucket to the queries' paths.
            with serving(["--data-dir", f"s3://{BUCKET}/data"], s3_env) as address:
                with flight_sql.connect(f"grpc://{address}") as conn, conn.cursor() as cursor:
                    cursor.execute(f"SELECT count(*) AS n FROM sim_join('{s3('points.csv')}', 0.05)")
                    served = cursor.fetch_arrow_table().to_pylist()[0]["n"]
                _, expected, _ = sql(f"SELECT count(*) AS n FROM sim_join('{local('points.csv')}', 0.05)", s3_env)
                checks.check("serve: a path under an s3:// --data-dir", served == expected[0]["n"], f"{served}")
    finally:
        server.stop()
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
