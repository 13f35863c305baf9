#!/usr/bin/env bash
# Issue 18's speculative-decoding benchmarks: two `tokenmill serve` on the same model, one
# with prompt lookup (`--speculative-config`, adaptive), one without, interleaved rounds
# (which goes first alternates), medians and per-round ratios:
#  1. one stream, repetition-heavy: "the same code/letter with one change" completions
#     (scripts/data/spec-edit-prompts.jsonl: 8, one a warm-up; 192 tokens out) — decode tok/s =
#     1000 / median TPOT;
#  2. one stream, plain chat questions (scripts/data/spec-chat-prompts.jsonl: 8, one a
#     warm-up; 128 out);
#  3. concurrency 16, 128 random tokens in / 128 out: output tok/s.
# Also checks that greedy outputs of the edit prompts are the same on both servers.
# Usage: scripts/bench-spec.sh [ROUNDS=3]
# Env: TOKENMILL_BIN (default: build target/release/tokenmill), MODEL, SPEC (the
# --speculative-config JSON), PORT (8411; the other server uses PORT+1), SERVE_ARGS (more
# flags for both servers, e.g. "--activation-bits 8").
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/spec-workloads.sh
source scripts/spec-workloads.sh
rounds="${1:-3}"
tm="$(scripts/tokenmill-bin.sh)"
model="${MODEL:-$(scripts/fetch-model.sh)}"
spec="${SPEC:-{\"method\": \"ngram\", \"num_speculative_tokens\": 5\}}"
port="${PORT:-8411}"
out="$(mktemp -d)"
# No prefix caching: every run of a round sends the same prompts to both servers.
# shellcheck disable=SC2086 # SERVE_ARGS is a list of flags.
"$tm" serve --model "$model" --port "$port" --served-model-name m --no-enable-prefix-caching \
  ${SERVE_ARGS:-} > "$out/off.log" 2>&1 &
off=$!
# shellcheck disable=SC2086
"$tm" serve --model "$model" --port $((port + 1)) --served-model-name m --no-enable-prefix-caching \
  --speculative-config "$spec" ${SERVE_ARGS:-} > "$out/on.log" 2>&1 &
on=$!
trap 'kill $off $on 2>/dev/null; wait $off $on 2>/dev/null || true' EXIT
for p in "$port" $((port + 1)); do
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$p/health" > /dev/null && break; sleep 0.5; done
done
url() { if [ "$1" = on ]; then echo "http://127.0.0.1:$((port + 1))"; else echo "http://127.0.0.1:$port"; fi; }
bench() { # side workload seed
  local side=$1 w=$2 seed=$3 workload_args
  spec_workload_args "$w"
  "$tm" bench --base-url "$(url "$side")" --model m --num-warmups 1 --seed "$seed" \
    --json "$out/$w.$side.$seed.json" "${workload_args[@]}" > /dev/null
}
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  for w in edit chat c16; do
    if [ $((r % 2)) = 1 ]; then bench off $w "$r"; bench on $w "$r"; else bench on $w "$r"; bench off $w "$r"; fi
  done
done
python3 - "$out" "$rounds" "$port" "$spec" <<'PY'
import json, statistics, sys, urllib.request
out, rounds, port, spec = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def get(w, side, key):
    return [json.load(open(f"{out}/{w}.{side}.{r}.json"))["result"].get(key) for r in range(1, rounds + 1)]
def row(w, key, invert=False):
    a, b = get(w, "off", key), get(w, "on", key)
    if invert:  # TPOT ms -> decode tok/s
        a, b = [1000 / x for x in a], [1000 / x for x in b]
    ratio = statistics.median(y / x for x, y in zip(a, b))
    return statistics.median(a), statistics.median(b), ratio
def acc(w):
    rates = [x for x in get(w, "on", "spec_decode_acceptance_rate") if x is not None]
    lens = [x for x in get(w, "on", "spec_decode_acceptance_length") if x is not None]
    return (statistics.median(rates) if rates else 0.0, statistics.median(lens) if lens else 0.0)
print(f"speculative config: {spec}; rounds: {rounds} (medians; ratio = median over rounds of on/off)")
for w, title in [("edit", "one stream, edit prompts"), ("chat", "one stream, chat prompts")]:
    a, b, r = row(w, "median_tpot_ms", invert=True)
    ar, al = acc(w)
    print(f"{title}: decode tok/s (1000/median TPOT) off {a:.1f}  on {b:.1f}  ratio {r:.2f}  "
          f"(acceptance {ar:.0f}%, length {al:.2f})")
a, b, r = row("c16", "output_throughput")
ar, al = acc("c16")
print(f"concurrency 16, 128/128: output tok/s off {a:.1f}  on {b:.1f}  ratio {r:.3f}  "
      f"(acceptance {ar:.0f}%, length {al:.2f})")
same = 0
prompts = [json.loads(l)["prompt"] for l in open("scripts/data/spec-edit-prompts.jsonl")]
for p in prompts:
    texts = []
    for base in (port, port + 1):
        body = json.dumps({"model": "m", "prompt": p, "max_tokens": 192, "temperature": 0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{base}/v1/completions", body, {"content-type": "application/json"})
        texts.append(json.load(urllib.request.urlopen(req))["choices"][0]["text"])
    same += texts[0] == texts[1]
print(f"greedy edit outputs identical on both servers: {same}/{len(prompts)}")
PY
