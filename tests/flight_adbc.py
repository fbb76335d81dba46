#!/usr/bin/env python3
"""`simjoin serve` from Python's ADBC Flight SQL driver (adbc-driver-flightsql + pyarrow from PyPI).

Starts real `simjoin serve` processes (bearer token over plain gRPC; user/password over TLS with a
self-signed certificate made here), runs sim_join / range_query / knn statements and a prepared
statement with a parameter through ADBC, and checks every answer against the embedded library's
(`simjoin sql --format json` over the same files). Run by .ci/run; prints "N passed, N failed".
"""
import datetime
import json
import os
import struct
import subprocess
import sys
import tempfile

import adbc_driver_flightsql
import adbc_driver_flightsql.dbapi as flight_sql
from adbc_driver_manager import DatabaseOptions as StandardOptions

from checks import Checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The release binary: $SIMJOIN, or target/release/simjoin.
SIMJOIN = os.environ.get("SIMJOIN") or os.path.join(ROOT, "target", "release", "simjoin")

STATEMENTS = [
    "SELECT * FROM sim_join(points, 0.05) ORDER BY left_id, right_id",
    "SELECT * FROM range_query(points, queries, 0.1, 'metric=l1') ORDER BY query_id, base_id",
    "SELECT * FROM knn(points, queries, 10) ORDER BY query_id, rank",
    "SELECT * FROM knn(points, '[0.5, 0.5, 0.5]', 25, 'metric=cosine') ORDER BY rank",
]
PREPARED = "SELECT base_id, distance, rank FROM knn(points, queries, 5) WHERE query_id = $1 ORDER BY rank"


def as_f32(value):
    return struct.unpack("f", struct.pack("f", value))[0]


def normalised(rows):
    """Vector columns are Float32 lists: JSON prints each value's shortest f32 form, pyarrow gives
    its exact value as a Python float; rounding both to f32 compares the stored values exactly."""
    return [{k: [as_f32(x) for x in v] if isinstance(v, list) else v for k, v in row.items()} for row in rows]


def embedded(tables, sql):
    """The embedded library's answer, as a list of row dicts."""
    args = [SIMJOIN, "sql", "--format", "json", sql]
    for t in tables:
        args += ["--table", t]
    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    return normalised([json.loads(line) for line in out.splitlines() if line.strip()])


def start(tables, extra, env=None):
    args = [SIMJOIN, "serve", "--bind", "127.0.0.1:0"] + extra
    for t in tables:
        args += ["--table", t]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    line = proc.stdout.readline()
    address = line.split("://")[1].split()[0]
    return proc, address.split(":")[1]


def served(conn, sql, parameters=None):
    with conn.cursor() as cursor:
        cursor.execute(sql, parameters)
        return normalised(cursor.fetch_arrow_table().to_pylist())


def self_signed_certificate(directory):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert_path, key_path = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    open(cert_path, "wb").write(cert_pem)
    open(key_path, "wb").write(key_pem)
    return cert_path, key_path, cert_pem.decode()


def run_statements(checks, label, conn, tables):
    for sql in STATEMENTS:
        expected = embedded(tables, sql)
        got = served(conn, sql)
        checks.check(f"{label}: {sql[:60]}", len(expected) > 0 and got == expected, f"{len(got)} rows vs {len(expected)}")
    for query_id in (3, 17):
        expected = embedded(tables, PREPARED.replace("$1", str(query_id)))
        got = served(conn, PREPARED, (query_id,))
        checks.check(f"{label}: prepared knn, query_id = {query_id}", len(got) == 5 and got == expected, f"{got} vs {expected}")
    objects = conn.adbc_get_objects(depth="tables").read_all().to_pylist()
    names = {t["table_name"] for c in objects for s in c["catalog_db_schemas"] or [] for t in s["db_schema_tables"] or []}
    checks.check(f"{label}: get_objects lists the tables", {"points", "queries"} <= names, str(names))


def refused(checks, conn, label, sql, expected):
    try:
        served(conn, sql)
        checks.check(label, False, "the statement ran")
    except Exception as e:  # the driver raises its own error class
        checks.check(label, expected in str(e), str(e))


def confinement(checks, d, tables):
    """A read-only server confined to one data directory: what a client with a valid token can't do."""
    data, outside = os.path.join(d, "data"), os.path.join(d, "outside")
    os.makedirs(data)
    os.makedirs(outside)
    inside = os.path.join(data, "inside.parquet")
    subprocess.run([SIMJOIN, "gen", inside, "-n", "100", "-d", "3", "--seed", "9"], check=True, capture_output=True)
    big = os.path.join(data, "big.parquet")
    subprocess.run([SIMJOIN, "gen", big, "-n", "40000", "-d", "2", "--seed", "10"], check=True, capture_output=True)
    secret = os.path.join(outside, "secret.csv")
    open(secret, "w").write("x1,x2,x3\n0.1,0.2,0.3\n")
    os.symlink(secret, os.path.join(data, "link.csv"))
    pwned = os.path.join(data, "pwned.csv")
    proc, port = start(tables, ["--data-dir", data, "--query-timeout", "2s"], {"SIMJOIN_TOKEN": "py-token"})
    try:
        header = adbc_driver_flightsql.DatabaseOptions.AUTHORIZATION_HEADER.value
        with flight_sql.connect(f"grpc://127.0.0.1:{port}", autocommit=True, db_kwargs={header: "Bearer py-token"}) as conn:
            refused(checks, conn, "read-only: COPY", f"COPY (SELECT 1 AS x) TO '{pwned}' STORED AS CSV", "COPY is not allowed")
            checks.check("read-only: COPY wrote nothing", not os.path.exists(pwned))
            refused(checks, conn, "read-only: CREATE EXTERNAL TABLE",
                    "CREATE EXTERNAL TABLE e STORED AS CSV LOCATION '/etc/os-release'", "CREATE EXTERNAL TABLE is not allowed")
            refused(checks, conn, "read-only: DROP TABLE", "DROP TABLE points", "DROP is not allowed")
            refused(checks, conn, "read-only: SET", "SET datafusion.execution.batch_size = 1", "SET is not allowed")
            got = served(conn, "SELECT count(*) AS n FROM points")
            checks.check("read-only: the served table is intact", got == [{"n": 2000}], str(got))
            outside_paths = [("an absolute path", secret), ("'..'", f"{data}/../outside/secret.csv"),
                             ("a symbolic link", os.path.join(data, "link.csv"))]
            for label, path in outside_paths:
                refused(checks, conn, f"confined: {label} out of the data directory",
                        f"SELECT * FROM sim_join('{path}', 1.0)", "outside the server's data directories")
            got = served(conn, f"SELECT count(*) AS n FROM knn('{inside}', queries, 3)")
            checks.check("confined: a file inside the data directory", got == [{"n": 120}], str(got))
            refused(checks, conn, "a query past --query-timeout is cancelled",
                    f"SELECT count(*) AS n FROM sim_join('{big}', 10.0, 'device=cpu')", "query timeout")
            got = served(conn, "SELECT count(*) AS n FROM points")
            checks.check("the server answers after a cancelled query", got == [{"n": 2000}], str(got))
    finally:
        proc.terminate()
        checks.check("confined server exits 0 on SIGTERM", proc.wait(timeout=10) == 0)


def main():
    checks = Checks()
    with tempfile.TemporaryDirectory() as d:
        points, queries = os.path.join(d, "points.parquet"), os.path.join(d, "queries.parquet")
        subprocess.run([SIMJOIN, "gen", points, "-n", "2000", "-d", "3", "--seed", "7"], check=True, capture_output=True)
        subprocess.run([SIMJOIN, "gen", queries, "-n", "40", "-d", "3", "--seed", "8"], check=True, capture_output=True)
        tables = [f"points={points}", f"queries={queries}"]

        # Bearer token over plain gRPC.
        proc, port = start(tables, [], {"SIMJOIN_TOKEN": "py-token"})
        try:
            uri = f"grpc://127.0.0.1:{port}"
            header = adbc_driver_flightsql.DatabaseOptions.AUTHORIZATION_HEADER.value
            with flight_sql.connect(uri, autocommit=True, db_kwargs={header: "Bearer py-token"}) as conn:
                run_statements(checks, "token", conn, tables)
            for label, kwargs in [("no token", {}), ("wrong token", {header: "Bearer nope"})]:
                try:
                    with flight_sql.connect(uri, autocommit=True, db_kwargs=kwargs) as conn:
                        served(conn, STATEMENTS[0])
                    checks.check(f"{label} is refused", False, "the query ran")
                except Exception as e:  # the driver raises its own error class
                    checks.check(f"{label} is refused", "nauthenticated" in str(e) or "credentials" in str(e), str(e))
        finally:
            proc.terminate()
            checks.check("token server exits 0 on SIGTERM", proc.wait(timeout=10) == 0)

        # User and password (Flight handshake) over TLS with a self-signed certificate.
        cert_path, key_path, cert_pem = self_signed_certificate(d)
        proc, port = start(
            tables,
            ["--user", "ann", "--tls-cert", cert_path, "--tls-key", key_path],
            {"SIMJOIN_PASSWORD": "correct horse"},
        )
        try:
            uri = f"grpc+tls://localhost:{port}"
            roots = adbc_driver_flightsql.DatabaseOptions.TLS_ROOT_CERTS.value
            user, password = StandardOptions.USERNAME.value, StandardOptions.PASSWORD.value
            with flight_sql.connect(uri, autocommit=True, db_kwargs={roots: cert_pem, user: "ann", password: "correct horse"}) as conn:
                run_statements(checks, "tls+password", conn, tables)
            try:
                with flight_sql.connect(uri, autocommit=True, db_kwargs={roots: cert_pem, user: "ann", password: "wrong"}) as conn:
                    served(conn, STATEMENTS[0])
                checks.check("wrong password is refused", False, "the query ran")
            except Exception as e:
                checks.check("wrong password is refused", "nauthenticated" in str(e) or "credentials" in str(e), str(e))
        finally:
            proc.terminate()
            checks.check("TLS server exits 0 on SIGTERM", proc.wait(timeout=10) == 0)

        confinement(checks, d, tables)

    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
