#!/usr/bin/env bash
# Issue 4's in-process engine benchmarks (no HTTP), interleaved rounds, medians:
#  1. continuous vs static batching on mixed output lengths (closed loop, 16 clients,
#     64 prompts, 128 in / 128 out with lengths drawn from ×[0.1, 1.9]);
#  2. the same with exponential output lengths (mean 128: chat traffic's long tail);
#  3. SLA mode: load 1 with `--target-tpot-ms T` — measured P95 TPOT vs the target.
# Usage: scripts/bench-batching.sh [ROUNDS=3] [TPOT_MS=35]
# Env: TOKENMILL_BIN (default: build target/release/tokenmill), MODEL, NUM_PROMPTS,
#      CONCURRENCY, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
tpot="${2:-35}"
tm="$(scripts/tokenmill-bin.sh)"
model_args=()
[ -n "${MODEL:-}" ] && model_args=(--model "$MODEL")
common=(--num-prompts "${NUM_PROMPTS:-64}" --concurrency "${CONCURRENCY:-16}"
        --input-len 128 --output-len 128 --range-ratio 0.9)
[ -n "${THREADS:-}" ] && common+=(--threads "$THREADS")
out="$(mktemp -d)"
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  "$tm" bench-engine "${model_args[@]}" "${common[@]}" --seed "$r" --batching continuous > "$out/continuous.$r.txt"
  "$tm" bench-engine "${model_args[@]}" "${common[@]}" --seed "$r" --batching static > "$out/static.$r.txt"
  "$tm" bench-engine "${model_args[@]}" "${common[@]}" --seed "$r" --target-tpot-ms "$tpot" > "$out/sla.$r.txt"
  "$tm" bench-engine "${model_args[@]}" "${common[@]}" --seed "$r" --batching continuous --output-len-dist exponential > "$out/continuous-exp.$r.txt"
  "$tm" bench-engine "${model_args[@]}" "${common[@]}" --seed "$r" --batching static --output-len-dist exponential > "$out/static-exp.$r.txt"
done
python3 - "$out" "$rounds" "$tpot" <<'PY'
import re, statistics, sys
out, rounds, tpot = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
keys = {"Output token throughput (tok/s)": "out tok/s", "Median TTFT (ms)": "median TTFT ms",
        "P95 TTFT (ms)": "P95 TTFT ms", "Median TPOT (ms)": "median TPOT ms",
        "P95 TPOT (ms)": "P95 TPOT ms"}
def read(mode):
    vals = {k: [] for k in keys.values()}
    for r in range(1, rounds + 1):
        for line in open(f"{out}/{mode}.{r}.txt"):
            label, _, value = line.rpartition(":")
            if label.strip() in keys:
                vals[keys[label.strip()]].append(float(value))
    return {k: statistics.median(v) for k, v in vals.items() if v}
cols = ("continuous", "static", "sla", "continuous-exp", "static-exp")
modes = {m: read(m) for m in cols}
heads = ("continuous", "static", f"sla<={int(tpot)}ms", "cont. (exp)", "static (exp)")
print(f"{'figure':<16} " + " ".join(f"{h:>13}" for h in heads) + f"   (medians of {rounds} interleaved rounds)")
for k in keys.values():
    print(f"{k:<16} " + " ".join(f"{modes[m].get(k, float('nan')):>13.1f}" for m in cols))
for label, c, s in (("uniform ×[0.1, 1.9]", "continuous", "static"), ("exponential, mean 128", "continuous-exp", "static-exp")):
    print(f"continuous / static output tok/s, output lengths {label}: {modes[c]['out tok/s'] / modes[s]['out tok/s']:.2f}x")
print(f"SLA mode: P95 TPOT {modes['sla']['P95 TPOT ms']:.1f} ms vs target {tpot:.0f} ms")
PY
echo "raw outputs: $out" >&2
