#!/usr/bin/env bash
# What a quantization costs in quality, on the default model: perplexity of the shipped
# SmolLM2-135M-Instruct Q4_1, of its F16 dequantization (`tokenmill quantize
# --allow-requantize`; the original F16 weights are on no registry these machines reach), and of
# Q8_0 / Q4_1 / Q4_K / Q2_K made from that F16 by `tokenmill quantize`, on the text shipped in
# tests/eval/prose.txt — with llama.cpp's llama-perplexity on the same files beside it when the
# peer is built, and lm-eval against `tokenmill serve` of each file: its accuracy on the shipped
# multiple-choice task (tests/eval/lm_eval/tokenmill_choice.yaml) and its word perplexity on the
# same prose, paragraph by paragraph (tokenmill_prose.yaml). Prints a Markdown table
# (BENCHMARKS.md "Quality per quantization").
#
# Usage: scripts/quant-quality.sh
# Env:   TOKENMILL_BIN (default target/release/tokenmill, built if missing), CTX (256),
#        TEXT (tests/eval/prose.txt), WORK (target/quant-quality), THREADS (all cores),
#        LLAMA_CPP_BIN (the peer's folder; default: scripts/llama-cpp-peer.sh --where),
#        PORT (18473, for the servers lm-eval talks to)
set -euo pipefail
cd "$(dirname "$0")/.."
src="$(scripts/fetch-model.sh)"
bin="${TOKENMILL_BIN:-target/release/tokenmill}"
[ -x "$bin" ] || cargo build --release -p tokenmill >&2
ctx="${CTX:-256}"
text="${TEXT:-tests/eval/prose.txt}"
work="${WORK:-target/quant-quality}"
threads="${THREADS:-$(nproc)}"
peer="${LLAMA_CPP_BIN:-$(scripts/llama-cpp-peer.sh --where)}/llama-perplexity"
port="${PORT:-18473}"
lm_eval_py="$(scripts/lm-eval-deps.sh)"
mkdir -p "$work"

"$bin" quantize --allow-requantize "$src" "$work/f16.gguf" --type f16 2>/dev/null
for t in q8_0 q4_1 q4_k q2_k; do
  "$bin" quantize "$work/f16.gguf" "$work/$t.gguf" --type "$t" 2>/dev/null
done

ppl() {  # FILE -> "PPL ERR"
  "$bin" perplexity "$text" --model "$1" --ctx-size "$ctx" --threads "$threads" --json 2>/dev/null |
    python3 -c 'import json,sys; v=json.load(sys.stdin); print(v["ppl"], v["ppl_err"])'
}
peer_ppl() {  # FILE -> PPL, or "-" without the peer
  [ -x "$peer" ] || { echo -; return; }
  "$peer" -m "$1" -f "$text" -c "$ctx" -b "$ctx" -t "$threads" 2>&1 |
    sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p'
}

lm_eval() {  # FILE -> "ACC WORD_PPL": lm-eval's tokenmill_choice and tokenmill_prose, through `tokenmill serve`
  "$bin" serve --model "$1" --port "$port" --served-model-name m --threads "$threads" \
    --kv-cache-memory 128MiB --max-model-len 1024 2>/dev/null &
  local pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  rm -rf "$work/lm_eval"
  HF_HOME="$work/hf" HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$lm_eval_py" -m lm_eval run \
    --model local-completions --tasks tokenmill_choice,tokenmill_prose --include_path tests/eval/lm_eval \
    --model_args "model=m,base_url=http://127.0.0.1:$port/v1/completions,num_concurrent=2,tokenizer_backend=remote,max_length=1024" \
    --output_path "$work/lm_eval" >/dev/null 2>&1
  kill -TERM "$pid"; wait "$pid" || true
  python3 -c 'import json,glob,sys; r=json.load(open(glob.glob(sys.argv[1]+"/*/results_*.json")[0]))["results"]; print("%.2f %.3f" % (r["tokenmill_choice"]["acc,none"], r["tokenmill_prose"]["word_perplexity,none"]))' "$work/lm_eval"
}

read -r base _ < <(ppl "$work/f16.gguf")
echo "| weights | file MiB | tokenmill PPL ± s.e. | vs F16 | llama.cpp PPL | lm-eval word PPL | lm-eval acc (20 × 4-way) |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for row in "F16 (Q4_1 dequantized):f16.gguf" "Q8_0:q8_0.gguf" "Q4_1 (shipped):SHIPPED" \
           "Q4_1 (requantized):q4_1.gguf" "Q4_K:q4_k.gguf" "Q2_K:q2_k.gguf"; do
  name="${row%%:*}"
  file="${row#*:}"
  [ "$file" = SHIPPED ] && path="$src" || path="$work/$file"
  read -r p e < <(ppl "$path")
  read -r acc wppl < <(lm_eval "$path")
  mib=$(python3 -c "import os; print(f'{os.path.getsize(\"$path\")/2**20:.1f}')")
  python3 -c "
p, e, b = $p, $e, $base
print(f'| $name | $mib | {p:.3f} ± {e:.3f} | {100*(p/b-1):+.1f}% | $(peer_ppl "$path") | $wppl | $acc |')"
done
echo
echo "text: $text ($(wc -c <"$text") bytes), --ctx-size $ctx, second-half scoring, $threads threads"
