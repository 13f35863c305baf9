#!/usr/bin/env bash
# Issue 17's structured-output benchmarks against one `tokenmill serve`, interleaved rounds,
# medians (all requests 128 tokens in / 128 out, token-id prompts on /v1/completions):
#  1. concurrency 16: output tok/s with every request under a JSON schema vs unconstrained;
#  2. one stream: TPOT with the schema vs without (the mask's cost per token);
#  3. grammar compile: time to first token of a request with a schema never seen (cold)
#     vs the same schema again (cached), and vs no schema.
# The schema (an object holding an array of at least 500 small objects) cannot complete
# within 128 tokens, so constrained and free requests generate the same number of tokens.
# Usage: scripts/bench-structured.sh [ROUNDS=3]
# Env: TOKENMILL_BIN (default: build target/release/tokenmill), MODEL, PORT (8397).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
tm="$(scripts/tokenmill-bin.sh)"
model="${MODEL:-$(scripts/fetch-model.sh)}"
port="${PORT:-8397}"
base="http://127.0.0.1:$port"
out="$(mktemp -d)"
# No prefix caching: both workloads of a round send the same prompts.
"$tm" serve --model "$model" --port "$port" --served-model-name m --no-enable-prefix-caching \
  > "$out/server.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do curl -sf "$base/health" > /dev/null && break; sleep 0.5; done

schema='{"type": "object", "properties": {"rows": {"type": "array", "minItems": 500, "items": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 100000}, "name": {"type": "string", "maxLength": 16}, "ok": {"type": "boolean"}}, "required": ["id", "name", "ok"], "additionalProperties": false}}}, "required": ["rows"], "additionalProperties": false}'
extra="{\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"rows\", \"schema\": $schema}}}"
bench() { # name concurrency prompts seed [extra args]
  local name=$1 c=$2 n=$3 seed=$4; shift 4
  "$tm" bench --base-url "$base" --model m --concurrency "$c" --num-prompts "$n" --num-warmups 2 \
    --input-len 128 --output-len 128 --seed "$seed" --json "$out/$name.$seed.json" "$@" > /dev/null
}
# One request of `max_tokens` 1 with body extras $1: its time in ms (fails unless 200).
ttft() {
  curl -s -o /dev/null -w '%{http_code} %{time_total}\n' "$base/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\": \"m\", \"prompt\": \"Rows:\", \"max_tokens\": 1, \"temperature\": 0 $1}" \
    | awk '$1 != 200 { print "HTTP " $1 > "/dev/stderr"; exit 1 } { print $2 * 1000 }'
}
for r in $(seq 1 "$rounds"); do
  echo "round $r/$rounds" >&2
  # Alternate which goes first, so warm-up or drift favours neither.
  if [ $((r % 2)) = 1 ]; then
    bench free16 16 48 "$r"; bench schema16 16 48 "$r" --extra-body "$extra"
    bench free1 1 6 "$r"; bench schema1 1 6 "$r" --extra-body "$extra"
  else
    bench schema16 16 48 "$r" --extra-body "$extra"; bench free16 16 48 "$r"
    bench schema1 1 6 "$r" --extra-body "$extra"; bench free1 1 6 "$r"
  fi
  for k in 1 2 3; do
    fresh="${schema/\"rows\"/\"rows_${r}_$k\"}"
    fresh="${fresh/\"rows\"/\"rows_${r}_$k\"}"
    body=", \"guided_json\": $fresh"
    echo "$(ttft "$body") $(ttft "$body") $(ttft '')" >> "$out/ttft.txt"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def per_round(name, key):
    return [json.load(open(f"{out}/{name}.{r}.json"))["result"][key] for r in range(1, rounds + 1)]
def med(name, key):
    return statistics.median(per_round(name, key))
def ratio(a, b, key):  # median over rounds of b/a: each round's pair ran back to back
    return statistics.median(y / x for x, y in zip(per_round(a, key), per_round(b, key)))
f16, s16 = med("free16", "output_throughput"), med("schema16", "output_throughput")
f1, s1 = med("free1", "median_tpot_ms"), med("schema1", "median_tpot_ms")
r16 = ratio("free16", "schema16", "output_throughput")
r1 = ratio("free1", "schema1", "median_tpot_ms")
rows = [l.split() for l in open(f"{out}/ttft.txt")]
cold, cached, plain = (statistics.median(float(r[i]) for r in rows) for i in range(3))
print(f"rounds: {rounds} (medians; ratios: median over rounds of the pair run back to back)")
print(f"concurrency 16 output tok/s: free {f16:.1f}  json_schema {s16:.1f}  ratio {r16:.3f}")
print(f"single stream median TPOT ms: free {f1:.2f}  json_schema {s1:.2f}  overhead {100 * (r1 - 1):+.1f}%")
print(f"1-token request ms: cold schema {cold:.1f}  cached schema {cached:.1f}  no schema {plain:.1f}")
PY
