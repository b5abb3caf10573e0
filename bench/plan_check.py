#!/usr/bin/env python3
"""graphscale plan against measurement (docs/scaling.md): calibrate the planner from the 1-node
and 2-node shared-memory runs of `bench/run_benchmarks.sh scaling` (each model; both strategies
where present), then predict every run of that model (4 nodes, TCP: out of sample) and print
model / measured bytes, seconds and memory per rank as a markdown table. Repeats of a run
(`s_cost_dw_sharded_shm4.2.jsonl`, ...) make its measured seconds their median.

usage: bench/plan_check.py WORK BIN [TCP_LATENCY TCP_BANDWIDTH]
The simulated nodes share the machine's 2 cores: --cores-per-node 2 / nodes. Shared memory is
planned as 2 us and 4G per message and second; TCP with the given loopback latency and bandwidth
(default 38e-6 and 1.7G, measured with a Python socket ping-pong and stream on this machine).
"""
import glob
import json
import os
import statistics
import subprocess
import sys

work, binary = sys.argv[1], sys.argv[2]
tcp = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else ("38e-6", "1.7G")
GRAPH = ["--nodes", "1048576", "--edges", "16775987", "--dim", "64"]
MODEL = {
    "dw": ["--walks-per-node", "1", "--walk-length", "20"],
    "line": ["--model", "line", "--line-samples", "4"],
}


def measured(path):
    """The run's bytes and memory, and its seconds: the median over the run and its repeats
    (`NAME.2.jsonl`, `NAME.3.jsonl`, ... beside `NAME.jsonl`), whose seconds are listed."""
    runs = [path] + sorted(glob.glob(path[: -len(".jsonl")] + ".[0-9]*.jsonl"))
    secs = []
    for p in runs:
        ms = [json.loads(line) for line in open(p)]
        secs.append(max(m["train_seconds"] for m in ms))
    ms = [json.loads(line) for line in open(path)]
    return {
        "secs": statistics.median(secs),
        "all_secs": secs,
        "bytes": sum(m["comm_bytes_sent"] + m["one_sided_bytes"] for m in ms),
        "mem": max(m["memory_estimate_bytes"] for m in ms),
    }


def err(a, b):
    return "%+.0f%%" % (100 * (a / b - 1)) if b else "-"


print("| run | bytes: model | measured | error | seconds: model | measured | error | memory per rank: model | printed estimate |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for model, flags in MODEL.items():
    f = lambda st, net, n: os.path.join(work, f"s_cost_{model}_{st}_{net}{n}.jsonl")
    cal = [f(st, "shm", n) for n in (1, 2) for st in ("sharded", "replicated")]
    cal = [c for c in cal if os.path.exists(c)]
    if not cal:
        continue
    for st, key in (("sharded", 0), ("replicated", 1)):
        for net in ("shm", "tcp"):
            for n in (1, 2, 4):
                path = f(st, net, n)
                if not os.path.exists(path) or (net == "tcp" and n == 1):
                    continue
                m = measured(path)
                lat, bw = ("2e-6", "4G") if net == "shm" else tcp
                a = [binary, "plan", *GRAPH, *flags, "--ranks", str(n), "--ranks-per-node", "1",
                     "--threads", "2" if n == 1 else "1", "--cores-per-node", str(2 / n),
                     "--latency", lat, "--bandwidth", bw, "--json"]
                for c in cal:
                    a += ["--calibrate", c]
                out = subprocess.run(a, capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"{' '.join(a)}: {out.stderr}")
                p = json.loads(out.stdout)["plans"][key]
                fitted = " (fitted)" if path in cal else ""
                secs = "%.1f" % m["secs"]
                if len(m["all_secs"]) > 1:
                    secs += " (median of %s)" % ", ".join("%.1f" % x for x in m["all_secs"])
                print("| %s %s %s%d%s | %.3g | %.3g | %s | %.1f | %s | %s | %.0f MiB | %.0f MiB |" % (
                    "DeepWalk" if model == "dw" else "LINE", st, net, n, fitted,
                    p["bytes_per_epoch"], m["bytes"], err(p["bytes_per_epoch"], m["bytes"]),
                    p["seconds_per_epoch"], secs, err(p["seconds_per_epoch"], m["secs"]),
                    p["per_rank"] / 2**20, m["mem"] / 2**20))
