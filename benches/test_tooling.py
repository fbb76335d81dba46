#!/usr/bin/env python3
"""The benchmark tooling's own test: on tiny inputs, every exact peer returns the same number of
results as simjoin (it never asserts a time). Run by .ci/run after the cargo tests."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The release binary: $SIMJOIN, or target/release/simjoin.
SIMJOIN = os.environ.get("SIMJOIN") or os.path.join(ROOT, "target", "release", "simjoin")


def main():
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([SIMJOIN, "bench", "--tiny", "--dir", d, "--repeat", "1"], check=True)
        subprocess.run([sys.executable, os.path.join(HERE, "peers.py"), "--dir", d, "--simjoin", SIMJOIN], check=True)
        workloads = json.load(open(os.path.join(d, "simjoin.json")))
        peers = json.load(open(os.path.join(d, "peers.json")))
        passed = failed = 0
        for w in workloads:
            mine = [p for p in peers if p["workload"] == w["name"]]
            if not mine:
                print(f"FAIL {w['name']}: no peer ran")
                failed += 1
            for p in mine:
                if p["results"] == w["rows"] and w["rows"] > 0:
                    passed += 1
                    print(f"ok   {w['name']}: {p['peer']}: {p['results']} results")
                else:
                    failed += 1
                    print(f"FAIL {w['name']}: {p['peer']}: {p['results']} results, simjoin {w['rows']}")
        # Edit distance: RapidFuzz and DuckDB against simjoin's metric=levenshtein (exits 1 on a
        # differing count or kNN list).
        text = subprocess.run([sys.executable, os.path.join(HERE, "text.py"), "--tiny", "--dir",
                               os.path.join(d, "text"), "--simjoin", SIMJOIN])
        if text.returncode == 0:
            passed += 1
            print("ok   text: every peer's result equals simjoin's")
        else:
            failed += 1
            print("FAIL text: benches/text.py --tiny")
        print(f"{passed} passed, {failed} failed")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
