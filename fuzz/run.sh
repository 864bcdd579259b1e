#!/usr/bin/env bash
# Run one fuzz target (or all eight, one after another) with the flags of docs/fuzzing.md.
#
#   fuzz/run.sh [target|all] [seconds]      default: all, 600 seconds each
#
# Seeds (fuzz/seeds/<target>/, committed) and regressions (fuzz/regressions/<target>/)
# are copied into the working corpus fuzz/corpus/<target>/ (gitignored) first. Each
# run's output goes to fuzz/logs/<target>.log; crashes land in fuzz/artifacts/<target>/
# (cargo fuzz's default artifact prefix).
# Builds and runs are niced and single-process: the machine is shared.
set -euo pipefail

cd "$(dirname "$0")"
targets=(extender_args volcano_predicate admission_review quantity pod_annotations config pod_cost cel_selector)
target=${1:-all}
seconds=${2:-600}
if [[ $target == all ]]; then
    selected=("${targets[@]}")
else
    selected=("$target")
fi

nice -n 19 cargo +nightly fuzz build

mkdir -p logs
for t in "${selected[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    cp -n seeds/"$t"/* "corpus/$t/" 2>/dev/null || true
    if [[ -d regressions/$t ]]; then
        cp -n regressions/"$t"/* "corpus/$t/" 2>/dev/null || true
    fi
    echo "== $t: ${seconds}s, log fuzz/logs/$t.log (live: fuzz/fuzz-0.log)"
    # -jobs=1 -workers=1: libFuzzer runs the fuzzer as one child process writing
    # fuzz-0.log, and copies that log to its own output when the child ends.
    status=0
    nice -n 19 cargo +nightly fuzz run "$t" "corpus/$t" -- \
        -jobs=1 -workers=1 \
        -rss_limit_mb=2048 -max_len=1048576 -timeout=10 \
        -max_total_time="$seconds" -print_final_stats=1 \
        >"logs/$t.log" 2>&1 || status=$?
    grep -E '^#[0-9]+' "logs/$t.log" | tail -n 1 || true
    grep -E '^stat::|^SUMMARY|panicked at|^==[0-9]+== ?ERROR|Test unit written' "logs/$t.log" || true
    echo "corpus: $(find "corpus/$t" -type f | wc -l) files; artifacts: $(find "artifacts/$t" -type f | wc -l)"
    if [[ $status -ne 0 ]]; then
        echo "== $t: exit $status, see fuzz/logs/$t.log and fuzz/artifacts/$t/"
    fi
done
