#!/usr/bin/env bash
# Side-by-side against OpenVINO GenAI (Intel's CPU engine; oneDNN, AMX where the CPU has it)
# on the same GGUF, same threads, interleaved rounds (A B A B ...), medians and ratios:
#  1. raw speed: tokenmill bench-model pp512 / tg128 vs openvino_bench.py raw (prefill tok/s
#     from its TTFT on 512 token ids, decode tok/s from its TPOT over 128 tokens);
#  2. offline continuous batching: tokenmill bench-engine (64 prompts of 128 random ids,
#     128 tokens out, 16 running) vs openvino_bench.py batch (the same workload through its
#     ContinuousBatchingPipeline, 16 running), output tok/s.
# The peer is installed by ../shared/peers/openvino-genai.sh (PyPI `openvino-genai`, in a venv
# outside the project) and run by ../shared/peers/openvino_bench.py.
# Usage: scripts/bench-vs-openvino.sh [ROUNDS=3] [THREADS=nproc]
# Env: MODEL (default: the default model), TOKENMILL_BIN (default: build target/release/tokenmill),
#      PEERS (default ../shared/peers), KV_CACHE_DTYPE (tokenmill's --kv-cache-dtype, default f16;
#      OpenVINO's own KV cache is u8 by default, which int8 matches), ACTIVATION_BITS
#      (tokenmill's --activation-bits: 12, the default, or 8 — OpenVINO's CPU plugin quantizes
#      activations to 8 bits per 32 by default, DYNAMIC_QUANTIZATION_GROUP_SIZE = 32)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
threads="${2:-$(nproc)}"
model="${MODEL:-$(scripts/fetch-model.sh)}"
peers="${PEERS:-../shared/peers}"
kv="${KV_CACHE_DTYPE:-f16}"
py="$(bash "$peers/openvino-genai.sh")"
tm="$(scripts/tokenmill-bin.sh)"
out="$(mktemp -d)"
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  "$py" "$peers/openvino_bench.py" raw --model "$model" --threads "$threads" \
    --input-len 512 --output-len 128 --repetitions 1 --seed "$r" 2>/dev/null | tail -n 1 > "$out/ov-raw.$r.json"
  "$tm" bench-model --model "$model" --threads "$threads" --repetitions 1 --seed "$r" \
    --prompt 512 --generate 128 --batch 8 --kv-cache-dtype "$kv" \
    --activation-bits "${ACTIVATION_BITS:-12}" > "$out/tm-raw.$r.txt"
  "$tm" bench-engine --model "$model" --threads "$threads" --num-prompts 64 --concurrency 16 \
    --input-len 128 --output-len 128 --seed "$r" --kv-cache-dtype "$kv" \
    --activation-bits "${ACTIVATION_BITS:-12}" > "$out/tm-batch.$r.txt"
  "$py" "$peers/openvino_bench.py" batch --model "$model" --threads "$threads" \
    --num-prompts 64 --concurrency 16 --input-len 128 --output-len 128 --seed "$r" 2>/dev/null \
    | tail -n 1 > "$out/ov-batch.$r.json"
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
ov = {"pp512": [], "tg128": [], "batch16": []}
tm = {k: [] for k in ov}
for r in range(1, rounds + 1):
    j = json.load(open(f"{out}/ov-raw.{r}.json"))
    ov["pp512"].append(j["prefill_tok_s"])
    ov["tg128"].append(j["decode_tok_s"])
    ov["batch16"].append(json.load(open(f"{out}/ov-batch.{r}.json"))["output_tok_s"])
    for line in open(f"{out}/tm-raw.{r}.txt"):
        parts = line.split()
        if parts and parts[0] in ("pp512", "tg128"):
            tm[parts[0]].append(float(parts[3]))
    for line in open(f"{out}/tm-batch.{r}.txt"):
        label, _, value = line.rpartition(":")
        if label.strip() == "Output token throughput (tok/s)":
            tm["batch16"].append(float(value))
print(f"{'test':<10} {'OpenVINO tok/s':>15} {'tokenmill tok/s':>16} {'ratio':>7}   (medians of {rounds} interleaved rounds)")
for k in ov:
    p, o = statistics.median(ov[k]), statistics.median(tm[k])
    print(f"{k:<10} {p:>15.1f} {o:>16.1f} {o / p:>6.2f}x")
PY
echo "raw outputs: $out" >&2
