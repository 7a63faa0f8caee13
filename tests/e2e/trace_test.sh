#!/usr/bin/env bash
# Per-rank timelines: a 2-rank run with trace: true writes trace/rank-N.json for steps 2-4. Each
# parses as a Chrome trace, its events nest properly on every thread (an event either ends before
# the next starts or holds it whole), it has layers' forward and backward, kernels and the
# collectives with their bytes; `fabrica trace summary --json`'s compute, exposed communication
# and idle time, recomputed here from the events, add up to each step's wall time (within 5%).
# Usage: trace_test.sh FABRICA_BINARY SHARED_DIR
set -euo pipefail
source "$(dirname "$0")/common.sh"
e2e_begin "$@"
e2e_workdir

tiny_model model
{ sft_config; cat <<YAML; } > run.yaml
cutoff_len: 64
max_samples: 32
max_steps: 5
save_steps: 0
nproc_per_node: 2
threads: 1
trace: true
YAML
"$fabrica" train run.yaml output_dir=out >train.log 2>&1 || { tail -20 train.log; fail "traced run"; }
grep -q "trace: steps 2 to 4 in out/trace" train.log || fail "no trace line"
"$fabrica" trace summary out >summary.txt || fail "trace summary"
cat summary.txt
grep -q "^slowest rank: " summary.txt || fail "no straggler line"
"$fabrica" trace summary out --json >summary.json
python3 - out/trace summary.json <<'PY' || fail "trace check"
import json, sys
summary = {r["rank"]: r for r in json.load(open(sys.argv[2]))}
for rank in (0, 1):
    trace = json.load(open(f"{sys.argv[1]}/rank-{rank}.json"))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    cats = {e["cat"] for e in events}
    assert {"step", "unit", "compute", "comm", "wait", "data"} <= cats, cats
    assert any(e["name"] == "backward layer 1" for e in events) and any(e["name"] == "forward head" for e in events)
    assert all(e["args"]["bytes"] > 0 for e in events if e["cat"] == "comm" and "gradients" in e["name"])
    # Proper nesting on each thread (timestamps are microseconds; allow 1 us of rounding).
    for tid in names:
        stack = []
        for e in sorted((e for e in events if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1] - 1:
                stack.pop()
            assert not stack or e["ts"] + e["dur"] <= stack[-1] + 1, (names[tid], e)
            stack.append(e["ts"] + e["dur"])
    # Each step of the compute thread: waiting, else busy, else idle; recomputed by sampling.
    compute_tid = [t for t, n in names.items() if n == "compute"][0]
    mine = [e for e in events if e["tid"] == compute_tid]
    steps = [e for e in mine if e["cat"] == "step"]
    assert len(steps) == 3, len(steps)
    totals = {"compute": 0.0, "wait": 0.0, "idle": 0.0, "step": 0.0}
    for s in steps:
        inside = [e for e in mine if e["cat"] != "step" and e["ts"] < s["ts"] + s["dur"] and e["ts"] + e["dur"] > s["ts"]]
        n = 4000
        for i in range(n):
            t = s["ts"] + (i + 0.5) * s["dur"] / n
            covering = [e["cat"] for e in inside if e["ts"] <= t < e["ts"] + e["dur"]]
            kind = "wait" if "wait" in covering else "compute" if covering else "idle"
            totals[kind] += s["dur"] / n * 1e-6
        totals["step"] += s["dur"] * 1e-6
    r = summary[rank]
    assert abs(r["step_s"] - totals["step"]) < 1e-6 * 3, (r, totals)
    assert abs(r["compute_s"] + r["exposed_comm_s"] + r["idle_s"] - r["step_s"]) < 0.05 * r["step_s"], r
    for mine_key, theirs in (("compute", "compute_s"), ("wait", "exposed_comm_s"), ("idle", "idle_s")):
        assert abs(totals[mine_key] - r[theirs]) < 0.05 * totals["step"], (mine_key, totals, r)
    print(f"rank {rank}: {len(events)} events nest; compute {totals['compute']:.3f} s, "
          f"waiting {totals['wait']:.3f} s, idle {totals['idle']:.3f} s of {totals['step']:.3f} s")
PY
echo "ok: traces parse, nest, and add up per step"
