#!/usr/bin/env bash
# Scale-out on loopback (issue 19): one tokenmill worker on one core (A) against two workers,
# each on a core of its own, behind SGLang's model gateway `smg` with round robin (B) — the
# same closed-loop load from `tokenmill bench`, interleaved A B A B. Prompts go as text: smg
# answers 400 to a /v1/completions prompt of token ids. Two threads per worker would
# oversubscribe a 2-core machine, so every worker runs `--threads 1` pinned with taskset.
# Writes RESULTS/gateway.{json,txt}.
# Usage: scripts/bench-gateway.sh [RESULTS_DIR=bench-results/gateway-<date>]
# Env: CONCURRENCY (64), PROMPTS (256), INPUT_LEN (128), OUTPUT_LEN (64), ROUNDS (2), POLICY
#      (round_robin), MODEL, TOKENMILL_BIN (default: build target/release/tokenmill), BASE_PORT.
set -euo pipefail
cd "$(dirname "$0")/.."
results="${1:-bench-results/gateway-$(date +%Y%m%d-%H%M%S)}"
conc="${CONCURRENCY:-64}"
model="${MODEL:-$(scripts/fetch-model.sh)}"
tm="$(scripts/tokenmill-bin.sh)"
gw="$(scripts/gateway-deps.sh)"
base="${BASE_PORT:-18700}"
mkdir -p "$results"

pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
wait_ready() { # URL
  for _ in $(seq 1 600); do
    curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "$1 did not come up" >&2
  return 1
}
worker() { # CORE PORT
  taskset -c "$1" "$tm" serve --model "$model" --port "$2" --threads 1 --max-num-seqs "$conc" \
    --served-model-name m >"$results/worker-$2.log" 2>&1 &
  pids+=($!)
}

worker 0 $((base + 1))                       # A: alone
worker 0 $((base + 2))                       # B: two, behind the gateway
worker 1 $((base + 3))
wait_ready "http://127.0.0.1:$((base + 1))"
wait_ready "http://127.0.0.1:$((base + 2))"
wait_ready "http://127.0.0.1:$((base + 3))"
"$gw/smg" launch --host 127.0.0.1 --port "$base" --prometheus-port $((base + 9)) \
  --policy "${POLICY:-round_robin}" \
  --worker-urls "http://127.0.0.1:$((base + 2))" "http://127.0.0.1:$((base + 3))" \
  >"$results/smg.log" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$base"
/usr/bin/time -f "load generator (tokenmill bench): %U s user + %S s system" \
  -o "$results/client-cpu.txt" \
  "$tm" bench --base-url "http://127.0.0.1:$((base + 1))" --compare-url "http://127.0.0.1:$base" \
  --model m --model-path "$model" --concurrency "$conc" --num-prompts "${PROMPTS:-256}" \
  --num-warmups 2 --rounds "${ROUNDS:-2}" --input-len "${INPUT_LEN:-128}" --prompt-format text \
  --output-len "${OUTPUT_LEN:-64}" --seed "$RANDOM" --json "$results/gateway.json" \
  | tee "$results/gateway.txt"
echo "A: one worker on core 0; B: smg ${POLICY:-round_robin} over workers on cores 0 and 1" \
  | tee -a "$results/gateway.txt"
# Where the cores went: the load generator and the gateway share them with B's workers.
tck="$(getconf CLK_TCK)"
cpu() { awk -v t="$tck" '{printf "%.1f s", ($14 + $15) / t}' "/proc/$1/stat"; }
{
  echo "CPU: worker A $(cpu "${pids[0]}"); B's workers $(cpu "${pids[1]}") + $(cpu "${pids[2]}");" \
    "smg $(cpu "${pids[3]}")"
  cat "$results/client-cpu.txt"
} | tee -a "$results/gateway.txt"
