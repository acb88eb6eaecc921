#!/usr/bin/env bash
# GPU work sized for the device machine's calls (torch and Triton preinstalled, no network; a
# call may run 600 s at most), everything written under $OUT:
#   bash scripts/gpu_check.sh tests          # the whole suite on the GPU, -n 14   (~140 s)
#   bash scripts/gpu_check.sh micro          # torchfuse bench --suite micro        (~200 s)
#   bash scripts/gpu_check.sh models [CASES] # the models suite, or the named cases (~100 s a case)
#   bash scripts/gpu_check.sh quick          # tests, then micro: one call
#   bash scripts/gpu_check.sh compile CASES  # cold and warm compile, Inductor and torchfuse, of the
#                                            # named model cases (issue 18), plus the compile-ahead
#                                            # tests and the serial/pool/warm measurement on the GPU
#   bash scripts/gpu_check.sh profile CASES  # per step: wall vs GPU ms, launches, host us/launch, top
#                                            # kernels; eager, Inductor, torchfuse and both
#                                            # reduce-overhead modes (issue 15; ~150 s a case)
#   bash scripts/gpu_check.sh verify CASES   # after a change: the whole suite (-v, so a cut-short
#                                            # run still names its failures; ~210 s), then the
#                                            # profile of the named cases (eager, Inductor, torchfuse;
#                                            # ~100-150 s a training case)
#   bash scripts/gpu_check.sh autotune [CASES] # max-autotune (issue 16): its tests, then the bench
#                                            # of the micro suite (or the named cases) with torchfuse
#                                            # and both compilers' max-autotune, cold and warm
# The OpInfo tests need `expecttest`, absent there: carry its wheel in .whl/ (gpu_env.sh installs it).
# Results come back as $OUT/results.tgz beside the top-level logs (a call returns at most 8 files).
# Each step has its own time limit so that a slow one cannot cost the others their results.
set -uo pipefail
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
what="${1:-quick}"
cases="${2:-}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.used --format=csv > "$out/gpu.txt" 2>&1
git log --oneline -1 > "$out/commit.txt" 2>&1

run_tests() {
    timeout 200 python3 -m pytest tests -n 14 -q -p no:cacheprovider -p no:logging --timeout 150 \
        -W ignore --tb=short > "$out/tests.log" 2>&1
    echo "tests exit $?" >> "$out/tests.log"
}
run_bench() {  # suite, time limit, extra arguments
    timeout "$2" python3 -m torchfuse bench --suite "$1" --device cuda --no-warm --out "$out/$1" \
        "${@:3}" > "$out/$1.log" 2>&1
    echo "$1 exit $?" >> "$out/$1.log"
}

run_compile() {  # cases: cold (this process) and warm (a child per backend), with the split
    timeout 60 python3 -m pytest tests/test_compile_ahead.py tests/test_binary_cache.py tests/test_launch.py \
        -q -p no:cacheprovider -p no:logging -W ignore --tb=short > "$out/compile_tests.log" 2>&1
    echo "compile tests exit $?" >> "$out/compile_tests.log"
    timeout 60 python3 scripts/measure_compile_ahead.py --kernels 64 > "$out/compile_measure.log" 2>&1
    timeout 460 python3 -m torchfuse bench --suite models --device cuda --backends eager,inductor,torchfuse \
        --repeats 3 --out "$out/compile" ${1:+--cases "$1"} > "$out/compile.log" 2>&1
    echo "compile exit $?" >> "$out/compile.log"
}

run_autotune() {  # cases (default: the micro suite)
    timeout 120 python3 -m pytest tests/test_autotune.py tests/test_launch.py -q -p no:cacheprovider \
        -p no:logging -W ignore --tb=short > "$out/autotune_tests.log" 2>&1
    echo "autotune tests exit $?" >> "$out/autotune_tests.log"
    local suite=micro
    [ -n "$1" ] && suite=all
    timeout 460 python3 -m torchfuse bench --suite "$suite" --device cuda --repeats 10 \
        --backends eager,inductor,torchfuse,inductor-max-autotune,torchfuse-max-autotune \
        --out "$out/autotune" ${1:+--cases "$1"} > "$out/autotune.log" 2>&1
    echo "autotune exit $?" >> "$out/autotune.log"
}

run_verify() {  # cases
    timeout 280 python3 -m pytest tests -n 14 -o addopts="" -v -p no:cacheprovider -p no:logging --timeout 200 \
        -W ignore --tb=short > "$out/tests.log" 2>&1
    echo "tests exit $?" >> "$out/tests.log"
    grep -E "^(FAILED|ERROR)|passed|failed" "$out/tests.log" | tail -15 > "$out/failures.txt"
    timeout 300 python3 scripts/gpu_profile.py ${1:+--cases "$1"} --backends eager,inductor,torchfuse \
        --out "$out/profile" > "$out/profile.log" 2>&1
    echo "profile exit $?" >> "$out/profile.log"
}

case "$what" in
    tests) run_tests ;;
    verify) run_verify "$cases" ;;
    compile) run_compile "$cases" ;;
    autotune) run_autotune "$cases" ;;
    micro) run_bench micro 540 ;;
    profile) timeout 560 python3 scripts/gpu_profile.py ${cases:+--cases "$cases"} \
                 --backends eager,inductor,torchfuse,inductor-ro,torchfuse-ro --out "$out/profile" \
                 > "$out/profile.log" 2>&1; echo "profile exit $?" >> "$out/profile.log" ;;
    models) run_bench models 560 ${cases:+--cases "$cases"} ;;
    quick) run_tests; run_bench micro 300 ;;
    *) echo "usage: bash scripts/gpu_check.sh [tests|verify CASES|micro|models [CASES]|compile CASES|profile CASES|autotune [CASES]|quick]" >&2
       exit 2 ;;
esac
tail -n 4 "$out"/*.log
# A device call brings back at most 8 files (device/README.md): everything goes into one archive,
# and only the short top-level logs stay beside it.
pack_results() {
    # The archive is written outside $out: tar fails ("file changed as we read it") on a directory
    # that grows while it reads it, and the clean-up below would then delete the only copy.
    local archive="$out/results.tgz" staging
    staging="$(mktemp /tmp/results.XXXXXX.tgz)"
    tar czf "$staging" -C "$out" --exclude results.tgz . && mv "$staging" "$archive" || return 0
    find "$out" -mindepth 1 -depth ! -name results.tgz ! -name '*.log' ! -name failures.txt -delete 2>/dev/null
    find "$out" -mindepth 2 -name '*.log' -delete 2>/dev/null
    find "$out" -mindepth 1 -type d -empty -delete 2>/dev/null
    return 0
}
pack_results
