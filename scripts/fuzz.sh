#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ (ASan, release) and runs each for FUZZ_SECONDS
# (default 60) from a scratch corpus initialised from the committed seeds in
# fuzz/seeds/<target>/ and fuzz/regressions/<target>/ (inputs that once crashed it; neither
# is ever mutated), under
# -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10. Prints a table of executions,
# exec/s, coverage (cov/ft), corpus size and peak RSS per target, and the artifact of any
# crash / leak / timeout / OOM; exits non-zero if any target failed.
#
# Usage: scripts/fuzz.sh [TARGET...]          (default: every target; see fuzz/README.md)
# Environment: FUZZ_SECONDS (60), FUZZ_WORK (scratch dir, default target/fuzz-run; wiped per
#   target), TOKENMILL_FUZZ_MODEL (the model the server/tokenizer targets load; default
#   models/SmolLM2-135M-Instruct.Q4_1.gguf, fetched by scripts/fetch-model.sh).
# Needs a nightly toolchain (libFuzzer + -Zsanitizer=address); without one it prints
# "SKIPPED fuzzing: no nightly toolchain" and exits 0. Installs cargo-fuzz if missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "SKIPPED fuzzing: no nightly toolchain"
    exit 0
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz ..." >&2
    cargo +nightly install cargo-fuzz --locked
fi

seconds="${FUZZ_SECONDS:-60}"
work="${FUZZ_WORK:-$root/target/fuzz-run}"
mkdir -p "$work"
work="$(cd "$work" && pwd)"

mapfile -t all_targets < <(cargo +nightly fuzz list)
if [ "$#" -gt 0 ]; then targets=("$@"); else targets=("${all_targets[@]}"); fi
for t in "${targets[@]}"; do
    if ! printf '%s\n' "${all_targets[@]}" | grep -qx -- "$t"; then
        echo "error: unknown fuzz target $t (known: ${all_targets[*]})" >&2
        exit 2
    fi
done

# -max_len per target (bytes): what a meaningful input needs, not more.
max_len() {
    case "$1" in
        gguf_parse) echo 65536 ;;
        safetensors_parse | tokenizer_json) echo 16384 ;;
        gguf_vocab) echo 8192 ;;
        output_assembly) echo 2048 ;;
        *) echo 4096 ;;
    esac
}
dict() {
    case "$1" in
        gguf_parse) echo fuzz/gguf.dict ;;
        safetensors_parse | tokenizer_json | validate_completions | validate_chat | tokenize_routes)
            echo fuzz/json.dict ;;
        chat_template) echo fuzz/jinja.dict ;;
        *) echo "" ;;
    esac
}
needs_model() {
    case "$1" in
        validate_completions | validate_chat | tokenize_routes | output_assembly) return 0 ;;
        *) return 1 ;;
    esac
}

for t in "${targets[@]}"; do
    if needs_model "$t"; then
        if [ -z "${TOKENMILL_FUZZ_MODEL:-}" ]; then
            TOKENMILL_FUZZ_MODEL="$(scripts/fetch-model.sh)"
            export TOKENMILL_FUZZ_MODEL
        fi
        break
    fi
done

start=$(date +%s)
echo "building fuzz targets (cargo +nightly fuzz build, ASan, release) ..." >&2
if ! cargo +nightly fuzz build 2>&1 | grep -vE '^[[:space:]]+Compiling' >&2; then
    echo "error: building the fuzz targets failed" >&2
    exit 1
fi
built=$(date +%s)
echo "build: $((built - start)) s" >&2
triple="$(rustc +nightly -vV | sed -n 's/^host: //p')"
bin_dir="$root/fuzz/target/$triple/release"

rows=()
failed=0
for t in "${targets[@]}"; do
    corpus="$work/$t/corpus"
    artifacts="$work/$t/artifacts/"
    log="$work/$t/log.txt"
    rm -rf "${work:?}/$t"
    mkdir -p "$corpus" "$artifacts"
    if [ -d "fuzz/seeds/$t" ]; then cp -r "fuzz/seeds/$t/." "$corpus/"; fi
    # Inputs that once crashed a target (kept fixed by a test in the crate at fault).
    if [ -d "fuzz/regressions/$t" ]; then cp -r "fuzz/regressions/$t/." "$corpus/"; fi
    args=(-max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10
          -max_len="$(max_len "$t")" -print_final_stats=1 -artifact_prefix="$artifacts")
    d="$(dict "$t")"
    if [ -n "$d" ]; then args+=(-dict="$root/$d"); fi
    echo "== $t: ${seconds}s (log: $log)" >&2
    t0=$(date +%s)
    set +e
    "$bin_dir/$t" "${args[@]}" "$corpus" >"$log" 2>&1
    rc=$?
    set -e
    t1=$(date +%s)
    done_line="$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n1 || true)"
    stat() { sed -n "s/^stat::$1:[[:space:]]*//p" "$log" | tail -n1; }
    execs="$(stat number_of_executed_units)"
    eps="$(stat average_exec_per_sec)"
    rss="$(stat peak_rss_mb)"
    cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")"
    ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$done_line")"
    corp="$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$done_line")"
    if [ -z "$cov" ]; then
        # No DONE line (crash): take the last status line.
        last="$(grep -E '^#[0-9]+' "$log" | tail -n1 || true)"
        cov="$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")"
        ft="$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")"
        corp="$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")"
    fi
    status=ok
    if [ "$rc" -ne 0 ]; then
        failed=1
        status="FAIL(rc=$rc)"
        art="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n1)"
        echo "!! $t failed (exit $rc): $(grep -m1 -E 'ERROR: libFuzzer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|panicked at|==ERROR' "$log" || tail -n1 "$log")" >&2
        echo "!! artifact: ${art:-none}   log: $log" >&2
        echo "!! reproduce: cargo +nightly fuzz run $t ${art:-<artifact>}" >&2
        tail -n 40 "$log" >&2
    fi
    rows+=("$(printf '%-22s %-12s %12s %8s %7s %8s %6s %6s %6s' "$t" "$status" "${execs:--}" \
        "${eps:--}" "${cov:--}" "${ft:--}" "${corp:--}" "${rss:--}" "$((t1 - t0))")")
done

echo
printf '%-22s %-12s %12s %8s %7s %8s %6s %6s %6s\n' target status execs exec/s cov ft corpus rss_mb wall_s
for r in "${rows[@]}"; do echo "$r"; done
end=$(date +%s)
echo "build $((built - start)) s, fuzzing $((end - built)) s, total $((end - start)) s"
if [ "$failed" -ne 0 ]; then
    echo "fuzzing found failures (artifacts under $work/<target>/artifacts/)" >&2
    exit 1
fi
