#!/usr/bin/env python3
"""Independent check of a tokenmill trace (Chrome Trace Event JSON), standard library only.

Perfetto's own trace processor (PyPI `perfetto`) downloads its `trace_processor_shell`
binary at run time, which CI cannot do; this script checks what Perfetto's JSON importer
needs instead, plus tokenmill's own structure:

- the object form {"traceEvents": [...]}, every event with name/ph/ts/pid/tid of the right
  types, complete events with dur >= 0;
- complete events on one track nest strictly (no partial overlap: Perfetto rejects it);
- async begin/end pairs balance per (cat, name, id); counters carry numbers;
- every model op (cat "op") sits in forward < execute_model < step, and a step's ops add
  up to no more than the step.

Prints a JSON summary on stdout; exits 1 with the first violation on stderr.
"""
import json
import sys
from collections import defaultdict

EPS = 0.01  # µs; timestamps are rounded to ns


def fail(msg):
    print(f"check_trace: {msg}", file=sys.stderr)
    sys.exit(1)


def main(path):
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        fail("not the object form with a traceEvents list")
    events = doc["traceEvents"]
    names = {}
    slices = defaultdict(list)
    asyncs = defaultdict(int)
    counters = 0
    for i, e in enumerate(events):
        for k, t in (("name", str), ("ph", str), ("pid", int), ("tid", int)):
            if not isinstance(e.get(k), t):
                fail(f"event {i} lacks {k} of type {t.__name__}: {e}")
        ph = e["ph"]
        if ph != "M" and not isinstance(e.get("ts"), (int, float)):
            fail(f"event {i} has no numeric ts: {e}")
        if ph == "M":
            if e["name"] == "thread_name":
                names[e["tid"]] = e["args"]["name"]
        elif ph == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                fail(f"complete event {i} has a bad dur: {e}")
            slices[e["tid"]].append(e)
        elif ph in ("b", "e"):
            key = (e.get("cat"), e["name"], str(e.get("id")))
            asyncs[key] += 1 if ph == "b" else -1
            if asyncs[key] < 0:
                fail(f"async end before begin: {key}")
        elif ph == "C":
            counters += 1
            if not e.get("args") or not all(isinstance(v, (int, float)) for v in e["args"].values()):
                fail(f"counter {i} without numeric args: {e}")
        elif ph != "i":
            fail(f"unexpected phase {ph!r} in event {i}")
    if any(v != 0 for v in asyncs.values()):
        fail(f"unbalanced async spans: {[k for k, v in asyncs.items() if v]}")

    max_depth = 0
    num_ops = 0
    op_sum_per_step = []
    for tid, evs in slices.items():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in evs:
            end = e["ts"] + e["dur"]
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - EPS:
                stack.pop()
            if stack and end > stack[-1]["ts"] + stack[-1]["dur"] + EPS:
                fail(f"partial overlap on track {tid}: {e['name']} vs {stack[-1]['name']}")
            parents = [s["name"] for s in stack]
            if e.get("cat") == "op":
                num_ops += 1
                if parents[:3] != ["step", "execute_model", "forward"]:
                    fail(f"op {e['name']} at {e['ts']} nested in {parents}, not step/execute_model/forward")
                stack[0]["_ops"] = stack[0].get("_ops", 0.0) + e["dur"]
            if e["name"] == "step":
                op_sum_per_step.append(e)
            stack.append(e)
            max_depth = max(max_depth, len(stack))
    steps = []
    for s in op_sum_per_step:
        ops = s.get("_ops", 0.0)
        if ops > s["dur"] + EPS:
            fail(f"step at {s['ts']}: ops {ops} µs exceed the step's {s['dur']} µs")
        steps.append({"dur": s["dur"], "ops": ops})
    print(json.dumps({
        "tracks": sorted(set(names.values())),
        "num_events": len(events),
        "num_ops": num_ops,
        "num_counters": counters,
        "num_async_spans": sum(1 for e in events if e["ph"] == "b"),
        "max_depth": max_depth,
        "steps": steps,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
