#!/usr/bin/env bash
# Interleaved A/B of several `tokenmill serve` builds or configurations on one workload: every
# server up at once (on ports from PORT, default 8450), each round sends the workload to each
# server in turn, reversing the order every other round; prints per-round figures and each
# server's per-round ratio to the first server. For comparing builds on a noisy machine,
# where only rounds run minutes apart from one another compare.
#
# Usage: scripts/bench-servers.sh ROUNDS WORKLOAD NAME=BIN|FLAGS [NAME=BIN|FLAGS ...]
#   WORKLOAD: edit | chat (one stream, the speculative-decoding prompts of bench-spec.sh;
#             decode tok/s = 1000 / median TPOT) or c16 (128 in / 128 out at concurrency 16;
#             output tok/s).
#   BIN|FLAGS: a tokenmill binary and the serve flags for it (shell words: quote JSON).
# Example:
#   scripts/bench-servers.sh 8 edit "off=/tmp/a|--activation-bits 8" \
#     "a=/tmp/a|--activation-bits 8 --speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":5}'" \
#     "b=/tmp/b|--activation-bits 8 --speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":5}'"
# Env: MODEL (default: the default model), PORT.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/spec-workloads.sh
source scripts/spec-workloads.sh
[ $# -ge 3 ] || { sed -n '2,17p' "$0"; exit 2; }
rounds=$1 workload=$2
shift 2
spec_workload_args "$workload" || { echo "unknown workload $workload (edit, chat, c16)" >&2; exit 2; }
model="${MODEL:-$(scripts/fetch-model.sh)}"
port="${PORT:-8450}"
out="$(mktemp -d)"
names=() ports=() pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null || true' EXIT
for spec in "$@"; do
  name=${spec%%=*} rest=${spec#*=}
  bin=${rest%%|*} flags=${rest#*|}
  if curl -sf "http://127.0.0.1:$port/health" > /dev/null; then
    echo "port $port is taken: stop what serves there or set PORT" >&2
    exit 1
  fi
  # `exec`: $! is the server itself, so the trap stops it. FLAGS are shell words.
  (eval "exec \"\$bin\" serve --model \"\$model\" --port $port --served-model-name m \
    --no-enable-prefix-caching $flags" > "$out/$name.log" 2>&1) &
  pids+=($!) names+=("$name") ports+=("$port")
  port=$((port + 1))
done
for i in "${!ports[@]}"; do
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:${ports[$i]}/health" > /dev/null && continue 2
    sleep 0.5
  done
  echo "${names[$i]} did not start: $(tail -3 "$out/${names[$i]}.log")" >&2
  exit 1
done
tm="$(scripts/tokenmill-bin.sh)"
for r in $(seq 1 "$rounds"); do
  order=("${!names[@]}")
  if [ $((r % 2)) = 0 ]; then order=($(printf '%s\n' "${order[@]}" | tac)); fi
  for i in "${order[@]}"; do
    "$tm" bench --base-url "http://127.0.0.1:${ports[$i]}" --model m --num-warmups 1 --seed "$r" \
      --json "$out/${names[$i]}.$r.json" "${workload_args[@]}" > /dev/null
  done
done
python3 - "$out" "$rounds" "$workload" "${names[@]}" <<'PY'
import json, statistics, sys
out, rounds, workload, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def figure(r):
    return r["output_throughput"] if workload == "c16" else 1000 / r["median_tpot_ms"]
unit = "output tok/s" if workload == "c16" else "decode tok/s (1000 / median TPOT)"
print(f"{workload}, {rounds} rounds, {unit}; ratio = per round, to {names[0]}")
first = None
for n in names:
    res = [json.load(open(f"{out}/{n}.{r}.json"))["result"] for r in range(1, rounds + 1)]
    f = [figure(x) for x in res]
    first = first or f
    ratios = [a / b for a, b in zip(f, first)]
    acc = [x.get("spec_decode_acceptance_length") for x in res]
    acc = f"  acceptance length {statistics.median(acc):.2f}" if None not in acc else ""
    print(f"{n:<12} {' '.join(f'{x:7.1f}' for x in f)}  median {statistics.median(f):7.1f}")
    print(f"{'':<12} ratio {' '.join(f'{x:.3f}' for x in ratios)}  median "
          f"{statistics.median(ratios):.3f}{acc}")
PY
