"""Summarise `bench/run_benchmarks.sh scaling`: every run whose metrics (or stop marker) exist in
WORK, the replicated-over-sharded ratios at equal nodes and network, and bench/results/scaling.json.
Usage: python3 bench/scaling_summary.py WORK OUT.json"""
import glob, json, os, re, sys

w, out = sys.argv[1], sys.argv[2]
res = {"flags": os.environ.get("GS_FLAGS", ""), "runs": {}}
names = sorted({re.sub(r"^s_|\.(jsonl|stopped)$", "", os.path.basename(f))
                for f in glob.glob(os.path.join(w, "s_*.jsonl")) + glob.glob(os.path.join(w, "s_*.stopped"))})
for name in names:
    mf = os.path.join(w, f"s_{name}.jsonl")
    if not os.path.exists(mf):
        last = [l for l in open(os.path.join(w, f"s_{name}.log")) if "pairs/s" in l]
        m = re.search(r"(\d+(?:\.\d+)?)%.*pairs/s (\d+).*?(\d+)s$", last[-1].strip()) if last else None
        res["runs"][name] = {"finished": False, "progress_percent": float(m.group(1)) if m else 0.0,
                             "rank0_pairs_per_second": int(m.group(2)) if m else 0,
                             "seconds_at_stop": int(m.group(3)) if m else 0}
        print(f"{name:30s} did not finish: {res['runs'][name]}")
        continue
    ms = [json.loads(l) for l in open(mf)]
    train = max(m["train_seconds"] for m in ms)
    pairs = sum(m["pairs"] for m in ms)
    moved = sum(m["comm_bytes_sent"] + m.get("one_sided_bytes", 0) for m in ms)
    r = {"finished": True, "ranks": len(ms), "nodes": ms[0].get("nodes"), "train_seconds": round(train, 2),
         "pairs": pairs, "pairs_per_second": round(pairs / train), "bytes_moved": moved,
         "bytes_per_pair": round(moved / pairs, 1),
         "peak_rss_per_rank_max": max(m["peak_rss_bytes"] for m in ms),
         "memory_estimate_per_rank_max": max(m["memory_estimate_bytes"] for m in ms),
         "phase_seconds_mean": {k: round(sum(m["seconds"][k] for m in ms) / len(ms), 2) for k in ms[0]["seconds"]}}
    f1 = os.path.join(w, f"s_{name}_f1.json")
    if os.path.exists(f1):
        r["micro_f1_50"] = round(json.load(open(f1))["results"]["0.5"]["micro_f1"] * 100, 2)
    res["runs"][name] = r
    print(f"{name:30s} {r['pairs_per_second'] / 1e6:6.2f}M pairs/s  train {train:7.1f} s  {r['bytes_per_pair']:7.1f} B/pair  "
          f"RSS {r['peak_rss_per_rank_max'] / 2**20:6.0f} MiB  F1 {r.get('micro_f1_50', '')}")
ratios = {}
for name, r in res["runs"].items():
    for st in ("_replicated_", "_dense_"):
        if st in name and r.get("finished"):
            base = res["runs"].get(name.replace(st, "_sharded_"))
            if base and base.get("finished"):
                ratios[name] = {"time": round(r["train_seconds"] / base["train_seconds"], 2),
                                "bytes": round(r["bytes_moved"] / max(1, base["bytes_moved"]), 2)}
res["replicated_over_sharded"] = ratios
for k, v in ratios.items():
    print(f"{k:30s} over sharded: time {v['time']}x, bytes {v['bytes']}x")
json.dump(res, open(out, "w"), indent=1)
