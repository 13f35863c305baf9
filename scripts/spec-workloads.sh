# Issue 18's benchmark workloads, sourced by bench-spec.sh and bench-servers.sh:
# `spec_workload_args W` sets the array `workload_args` to the `tokenmill bench` flags of
# workload W (edit, chat: one stream over the speculative-decoding prompts; c16: 128 random
# tokens in / 128 out at concurrency 16); returns 1 for an unknown W.
# shellcheck shell=bash
spec_workload_args() {
  case $1 in
    edit) workload_args=(--dataset-path scripts/data/spec-edit-prompts.jsonl --prompt-format text --num-prompts 8 --concurrency 1) ;;
    chat) workload_args=(--endpoint /v1/chat/completions --dataset-path scripts/data/spec-chat-prompts.jsonl --prompt-format text --num-prompts 8 --concurrency 1) ;;
    c16) workload_args=(--input-len 128 --output-len 128 --num-prompts 48 --concurrency 16) ;;
    *) return 1 ;;
  esac
}
