#!/usr/bin/env bash
# Builds the fuzz targets and runs each for a bounded time (README.md).
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]    (default: 60 s, every target)
#
# Needs a nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
# Runs FUZZ_JOBS targets at a time (default 2), each niced, with a memory
# cap (FUZZ_RSS_MB, default 2048) and a per-input timeout (FUZZ_TIMEOUT,
# default 10 s). Corpora grow in fuzz/corpus/<target> (not committed), seeded
# from fuzz/seeds/<target> (committed); crashes land in
# fuzz/artifacts/<target>; logs in fuzz/logs/<target>.log. Prints one line
# per target; exits 1 if any target found a crash, timeout or OOM.
set -euo pipefail
cd "$(dirname "$0")"

secs=${1:-60}
shift || true
jobs=${FUZZ_JOBS:-2}
rss=${FUZZ_RSS_MB:-2048}
per_input=${FUZZ_TIMEOUT:-10}

nice -n 10 cargo +nightly fuzz build -O >logs.build 2>&1 || { cat logs.build; exit 2; }
if [ $# -gt 0 ]; then targets=("$@"); else mapfile -t targets < <(cargo +nightly fuzz list); fi
mkdir -p logs

run_one() {
    local t=$1
    mkdir -p "corpus/$t" "artifacts/$t"
    local before
    before=$(ls "artifacts/$t" | wc -l)
    local start=$SECONDS
    nice -n 10 cargo +nightly fuzz run -O "$t" "corpus/$t" "seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb="$rss" -timeout="$per_input" \
        -print_final_stats=1 >"logs/$t.log" 2>&1 || true
    local runs cov ft found
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "logs/$t.log" | tail -1 | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "logs/$t.log" | tail -1 | grep -o '[0-9]*$' || echo "?")
    ft=$(grep -o 'ft: [0-9]*' "logs/$t.log" | tail -1 | grep -o '[0-9]*$' || echo "?")
    found=$(( $(ls "artifacts/$t" | wc -l) - before ))
    local verdict=ok
    if [ "$found" -gt 0 ]; then
        verdict="FOUND: $(ls -t "artifacts/$t" | head -"$found" | tr '\n' ' ')"
    fi
    printf '%-16s %5ss  runs %-10s cov %-6s ft %-7s corpus %-6s %s\n' \
        "$t" "$((SECONDS - start))" "$runs" "$cov" "$ft" "$(ls "corpus/$t" | wc -l)" "$verdict"
}
export -f run_one
export secs rss per_input

printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}' | tee -a logs/summary.txt
! grep -q FOUND <(tail -n "${#targets[@]}" logs/summary.txt)
