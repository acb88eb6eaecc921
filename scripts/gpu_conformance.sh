#!/usr/bin/env bash
# Conformance on the GPU machine (torch and Triton preinstalled, 16 cores, no network; a call may
# run 600 s), run from the repository root, everything written under $OUT:
#   bash scripts/gpu_conformance.sh sweep32 [DIR]   # OpInfo sweep, float32: torchfuse (triton) and Inductor
#                                                   # on the same samples, 14 workers, 3 samples per op
#   bash scripts/gpu_conformance.sh sweep16 [DIR]   # the same in bfloat16
#   bash scripts/gpu_conformance.sh fuzz            # random programs (tests/test_fuzz.py), 8 processes
#   bash scripts/gpu_conformance.sh all [DIR]       # the three in one call, each with a share of the time
# A sweep stops handing out ops before the call's time is up and writes what it has, the ops not
# run listed in the JSON; DIR (a folder that travels with the checkout: untracked, or carried)
# holding an earlier call's sweep-float32.json / sweep-bfloat16.json makes the sweep continue it.
# Settings (environment): BUDGET (seconds for the whole script, 560), WORKERS (14), SAMPLES (3),
# OP_TIMEOUT (seconds per op, 120), FUZZ_PROCS (8), FUZZ_EXAMPLES (programs per pytest run, 60),
# SWEEP_ARGS (more arguments for scripts/opinfo_sweep.py, last: e.g. "--ops add,sum --device cpu").
# The OpInfo database needs `expecttest`: its wheel travels in .whl/ (carry .whl).
set -uo pipefail
start=$(date +%s)
# shellcheck source=scripts/gpu_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"
what="${1:-}"
resume_dir="${2:-}"
budget="${BUDGET:-560}"
workers="${WORKERS:-14}"

left() { echo $(( budget - ($(date +%s) - start) )); }

{ nvidia-smi --query-gpu=name,memory.used --format=csv,noheader; git log --oneline -1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
    > "$out/machine.txt" 2>&1

sweep() {  # dtype, seconds for this sweep (from its start to its last file written)
    local dtype="$1" seconds="$2" json="$out/sweep-$1.json" resume=()
    if [ -n "$resume_dir" ] && [ -f "$resume_dir/sweep-$dtype.json" ]; then
        cp "$resume_dir/sweep-$dtype.json" "$json"
        resume=(--resume "$json")
    fi
    # No op is handed out after the deadline; ops running then get 30 s more; what is left of the
    # time (about 25 s) is for stopping the workers and writing the JSON. `timeout` is the backstop:
    # on SIGTERM the sweep still writes its results.
    timeout -k 10 "$seconds" python3 scripts/opinfo_sweep.py --device cuda --dtype "$dtype" \
        --backends torchfuse,inductor --workers "$workers" --max-samples "${SAMPLES:-3}" \
        --timeout "${OP_TIMEOUT:-120}" --deadline $((seconds - 55)) --grace 30 --progress 25 \
        --json "$json" "${resume[@]}" ${SWEEP_ARGS:-} > "$out/sweep-$dtype.log" 2>&1
    echo "sweep $dtype exit $? after $(( $(date +%s) - start )) s" | tee -a "$out/sweep-$dtype.log"
}

fuzz() {  # seconds: FUZZ_PROCS processes, each running pytest again with a new seed while time is left
    rm -f /tmp/fuzz-*.log
    local procs="${FUZZ_PROCS:-8}" end=$(( $(date +%s) + $1 - 5 ))
    for i in $(seq 1 "$procs"); do
        (
            k=0
            while [ $(( end - $(date +%s) )) -gt 60 ]; do
                seed=$(( i * 1000 + k ))
                echo "== process $i, seed $seed"
                TORCHFUSE_FUZZ_EXAMPLES="${FUZZ_EXAMPLES:-60}" timeout -k 5 $(( end - $(date +%s) )) \
                    python3 -m pytest tests/test_fuzz.py -k random_programs -q -x -p no:cacheprovider \
                    -p no:logging --hypothesis-seed="$seed" -W ignore --tb=short 2>&1 | tail -n 60
                status=${PIPESTATUS[0]}
                echo "== process $i, seed $seed: exit $status"
                [ "$status" -le 1 ] || break  # 0: passed, 1: a failure (shrunk, above); else broken or cut
                k=$(( k + 1 ))
            done
        ) > "/tmp/fuzz-$i.log" 2>&1 &
    done
    wait
    cat /tmp/fuzz-*.log > "$out/fuzz.log"
    local passed failed cut runs
    passed=$(grep -c ': exit 0$' "$out/fuzz.log"); failed=$(grep -c ': exit 1$' "$out/fuzz.log")
    cut=$(grep -cE ': exit (124|137)$' "$out/fuzz.log"); runs=$(grep -c ': exit ' "$out/fuzz.log")
    { echo "fuzz: pytest runs of ${FUZZ_EXAMPLES:-60} programs: $passed passed, $failed failed, $cut cut at the" \
           "time limit, $(( runs - passed - failed - cut )) broken (see fuzz.log)"
      grep -E ': exit [1-9]' "$out/fuzz.log"; } | tee "$out/fuzz.txt"
}

case "$what" in
    sweep32) sweep float32 "$(left)" ;;
    sweep16) sweep bfloat16 "$(left)" ;;
    fuzz) fuzz "$(left)" ;;
    all) share=$(( ($(left) - 100) / 2 ))
         sweep float32 "$share"; sweep bfloat16 "$share"; fuzz "$(left)" ;;
    *) echo "usage: bash scripts/gpu_conformance.sh sweep32|sweep16|fuzz|all [RESUME_DIR]" >&2; exit 2 ;;
esac
for log in "$out"/sweep-*.log; do
    [ -f "$log" ] && sed -n '/^== /,/^-- /p' "$log" | head -n 20
done
exit 0
