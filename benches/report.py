#!/usr/bin/env python3
"""Markdown table of simjoin's and the peers' times from DIR/simjoin.json and DIR/peers.json."""
import argparse
import json
import os
import platform

parser = argparse.ArgumentParser()
parser.add_argument("--dir", default="bench-out")
args = parser.parse_args()
simjoin = json.load(open(os.path.join(args.dir, "simjoin.json")))
peers = json.load(open(os.path.join(args.dir, "peers.json")))
print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores\n")
print("| workload | n × d | queries | result rows | simjoin (s) | peer | peer (s) | peer ÷ simjoin | same count |")
print("|---|---|---|---|---|---|---|---|---|")
for w in simjoin:
    mine = [p for p in peers if p["workload"] == w["name"]]
    n = w["base"].split("-")[1]
    first = True
    for p in mine or [None]:
        cells = [w["name"], f"{n} × {w['dim']}", "" if w["queries"] is None else "1000", str(w["rows"]), f"{w['simjoin_s']:.3f}"] if first else ["", "", "", "", ""]
        if p is None:
            cells += ["—", "", "", ""]
        else:
            cells += [p["peer"], f"{p['seconds']:.3f}", f"{p['seconds'] / w['simjoin_s']:.1f}×", "yes" if p["results"] == p["simjoin_results"] else f"no ({p['results']})"]
        print("| " + " | ".join(cells) + " |")
        first = False
