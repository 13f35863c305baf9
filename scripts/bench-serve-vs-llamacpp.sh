#!/usr/bin/env bash
# Serving side by side: `tokenmill serve` vs llama.cpp's `llama-server -np C` on the same model
# with the same thread count, loaded by `tokenmill bench` over HTTP (streaming, token-id
# prompts of exact length, ignore_eos), interleaved A B A B with a fresh seed per round, then an
# SLA sweep of each server with plots. Two workloads (issue 6):
#   c16: concurrency 16, 128 in / 128 out;  c32: concurrency 32, 512 in / 256 out.
# Writes RESULTS/<workload>.json (both sides, every record), RESULTS/<workload>.txt (the
# comparison table with ratios B/A, A = tokenmill, B = llama-server) and
# RESULTS/<workload>/{tokenmill,llama-server}/*.{png,svg} (sweep plots).
# Usage: scripts/bench-serve-vs-llamacpp.sh [RESULTS_DIR=bench-results/serve-<date>]
# Env: THREADS (2), ROUNDS (2), PROMPTS_C16 (64), PROMPTS_C32 (64), SWEEP_C16 (1,4,16),
#      SWEEP_C32 (1,8,32), SWEEP_PROMPTS (32), SLA_TTFT_MS (5000), SLA_TPOT_MS (200),
#      QUICK=1 (a tiny run: 4 prompts, 16 in / 8 out, one round — to check the script works),
#      MODEL, TOKENMILL_BIN (default: build target/release/tokenmill), PEER_SCRIPT, PORT_A, PORT_B.
set -euo pipefail
cd "$(dirname "$0")/.."
results="${1:-bench-results/serve-$(date +%Y%m%d-%H%M%S)}"
threads="${THREADS:-2}"
rounds="${ROUNDS:-2}"
model="${MODEL:-$(scripts/fetch-model.sh)}"
peer_bin="$(bash "${PEER_SCRIPT:-scripts/llama-cpp-peer.sh}" | tail -n 1)"
port_a="${PORT_A:-18431}"
port_b="${PORT_B:-18432}"
tm="$(scripts/tokenmill-bin.sh)"
mkdir -p "$results"

pids=()
cleanup() {
  for p in "${pids[@]:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  for p in "${pids[@]:-}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null || true
  done
  pids=()
}
trap cleanup EXIT

wait_ready() { # URL
  for _ in $(seq 1 600); do
    curl -sf "$1/health" >/dev/null 2>&1 && curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "server at $1 did not come up" >&2
  return 1
}

# name concurrency input_len output_len num_prompts sweep
run_workload() {
  local name="$1" conc="$2" in_len="$3" out_len="$4" n="$5" sweep="$6"
  local ctx=$((conc * (in_len + out_len + 16)))
  echo "== $name: concurrency $conc, $in_len in / $out_len out, $n prompts, $rounds rounds" >&2
  "$tm" serve --model "$model" --port "$port_a" --threads "$threads" --max-num-seqs "$conc" \
    >"$results/$name.tokenmill.log" 2>&1 &
  local pid_a=$!
  pids+=("$pid_a")
  "$peer_bin/llama-server" -m "$model" --port "$port_b" -t "$threads" -tb "$threads" \
    -np "$conc" -c "$ctx" >"$results/$name.llama-server.log" 2>&1 &
  local pid_b=$!
  pids+=("$pid_b")
  wait_ready "http://127.0.0.1:$port_a"
  wait_ready "http://127.0.0.1:$port_b"
  local common=(--model-path "$model" --input-len "$in_len" --output-len "$out_len"
    --sla-ttft-ms "${SLA_TTFT_MS:-5000}" --sla-tpot-ms "${SLA_TPOT_MS:-200}" --seed "$RANDOM")
  "$tm" bench --base-url "http://127.0.0.1:$port_a" --compare-url "http://127.0.0.1:$port_b" \
    --server-pid "$pid_a" --compare-server-pid "$pid_b" --concurrency "$conc" \
    --num-prompts "$n" --num-warmups 2 --rounds "$rounds" "${common[@]}" \
    --json "$results/$name.json" | tee "$results/$name.txt"
  for side in tokenmill llama-server; do
    local port="$port_a" pid="$pid_a"
    [ "$side" = llama-server ] && port="$port_b" && pid="$pid_b"
    "$tm" bench --base-url "http://127.0.0.1:$port" --server-pid "$pid" \
      --sweep-concurrency "$sweep" --num-prompts "${SWEEP_PROMPTS:-32}" "${common[@]}" \
      --plot-dir "$results/$name/$side" --json "$results/$name/$side/sweep.json" \
      | tail -n "$(( $(tr "," "\n" <<<"$sweep" | wc -l) + 3 ))" | tee -a "$results/$name.txt"
  done
  cleanup
}

if [ "${QUICK:-0}" = 1 ]; then
  rounds=1
  run_workload quick 2 16 8 4 1,2
else
  run_workload c16 16 128 128 "${PROMPTS_C16:-64}" "${SWEEP_C16:-1,4,16}"
  run_workload c32 32 512 256 "${PROMPTS_C32:-64}" "${SWEEP_C32:-1,8,32}"
fi
echo "results in $results" >&2
