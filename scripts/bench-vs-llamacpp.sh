#!/usr/bin/env bash
# Side-by-side raw model speed: tokenmill bench-model vs llama.cpp's llama-bench (pp512, tg128)
# and llama-batched-bench (128-token prompts, 128 decode steps, BATCHES sequences), same
# model, same thread count, interleaved rounds (A B A B ...), medians and ratios.
# Usage: scripts/bench-vs-llamacpp.sh [ROUNDS=5] [THREADS=nproc]
# Env: MODEL (default: the default model), BATCHES (default 8,32: the batched-decode sequence
#      counts), PEER_SCRIPT (default scripts/llama-cpp-peer.sh), TOKENMILL_BIN (default: build
#      target/release/tokenmill), ACTIVATION_BITS (tokenmill's --activation-bits: 12, the
#      default, or 8 — llama.cpp's own activations are 8-bit)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-5}"
threads="${2:-$(nproc)}"
batches="${BATCHES:-8,32}"
model="${MODEL:-$(scripts/fetch-model.sh)}"
peer_bin="$(bash "${PEER_SCRIPT:-scripts/llama-cpp-peer.sh}")"
tm="$(scripts/tokenmill-bin.sh)"
out="$(mktemp -d)"
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  "$peer_bin/llama-bench" -m "$model" -t "$threads" -p 512 -n 128 -r 1 -o jsonl > "$out/llama-bench.$r.jsonl" 2>/dev/null
  "$tm" bench-model --model "$model" --threads "$threads" --repetitions 1 --seed "$r" \
    --prompt 512 --generate 128 --batch "$batches" --activation-bits "${ACTIVATION_BITS:-12}" \
    > "$out/tokenmill.$r.txt"
  "$peer_bin/llama-batched-bench" -m "$model" -t "$threads" -c 16384 -b 2048 -ub 512 \
    -npp 128 -ntg 128 -npl "$batches" --output-format jsonl > "$out/batched.$r.jsonl" 2>/dev/null
done
python3 - "$out" "$rounds" "$batches" <<'PY'
import json, statistics, sys, glob
out, rounds = sys.argv[1], int(sys.argv[2])
peer = {"pp512": [], "tg128": [], **{f"bd{b}x128": [] for b in sys.argv[3].split(",")}}
ours = {k: [] for k in peer}
for r in range(1, rounds + 1):
    for line in open(f"{out}/llama-bench.{r}.jsonl"):
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        key = f"pp{j['n_prompt']}" if j["n_gen"] == 0 else f"tg{j['n_gen']}"
        peer[key].append(j["avg_ts"])
    for line in open(f"{out}/batched.{r}.jsonl"):
        if not line.startswith("{"):
            continue
        j = json.loads(line)
        peer[f"bd{j['pl']}x{j['tg']}"].append(j["speed_tg"])
    for line in open(f"{out}/tokenmill.{r}.txt"):
        parts = line.split()
        if parts and parts[0] in ours:
            ours[parts[0]].append(float(parts[3]))
print(f"{'test':<10} {'llama.cpp tok/s':>16} {'tokenmill tok/s':>16} {'ratio':>7}   (medians of {rounds} interleaved rounds)")
for k in peer:
    p, o = statistics.median(peer[k]), statistics.median(ours[k])
    print(f"{k:<10} {p:>16.1f} {o:>16.1f} {o / p:>6.2f}x")
PY
