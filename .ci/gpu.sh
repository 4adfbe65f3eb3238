#!/usr/bin/env bash
# The GPU checks, on a machine with a CUDA GPU, Python, torch, transformers, timm and peft but no project venv
# (and possibly no package registry): `make test-gpu` then `make bench-gpu`, each given what is left of one time
# budget, each log kept, and a summary last (the suite's result line and bench_gpu's targets block). Exits 1 when
# a step that ran failed, 2 on bad input.
#
#   bash .ci/gpu.sh                      # test, then the full benchmark (~8.5 min on one H100, cold caches)
#   bash .ci/gpu.sh test "bench:--cases lora-7b --variants new new+full-ac --no_predict"
#
# Steps: `test` (make test-gpu), `bench` (make bench-gpu), `bench:ARGS` (bench_gpu.py with ARGS). Environment:
# BUDGET (seconds for all steps, default 570), LOGS (folder for the logs; default $OUT where set, else gpu-logs),
# WHEELS (default .whl): packages the machine lacks, as wheels (`bash .ci/gpu_wheels.sh` fetches them where pip
# reaches PyPI), installed into /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(test bench)
for step in "${steps[@]}"; do
    case $step in
        test | bench | bench:*) ;;
        *) echo "gpu.sh: unknown step '$step'; valid: test, bench, bench:ARGS (bench_gpu.py's arguments)" >&2; exit 2 ;;
    esac
done
BUDGET=${BUDGET:-570}
LOGS=${LOGS:-${OUT:-gpu-logs}}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
start=$SECONDS

WHEELS=${WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
        || { echo "gpu.sh: could not install the wheels in $WHEELS/" >&2; exit 2; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -c "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__,
'| GPU:', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')" || exit 2

summary=()
status=0
for i in "${!steps[@]}"; do
    step=${steps[$i]}
    case $step in
        test) cmd=(make test-gpu PY=python3) ;;
        bench) cmd=(make bench-gpu PY=python3) ;;
        bench:*) read -ra bench_args <<<"${step#bench:}" && cmd=(python3 benchmarks/bench_gpu.py "${bench_args[@]}") ;;
    esac
    left=$((BUDGET - (SECONDS - start)))
    if [ "$left" -lt 30 ]; then
        summary+=("== $step: not run, ${left} s of the budget left")
        continue
    fi
    log="$LOGS/step$i.log"
    echo "== $step (${left} s left): ${cmd[*]}"
    step_start=$SECONDS
    timeout --signal=INT --kill-after=20 "$left" "${cmd[@]}" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 0 ] || status=1
    summary+=("== $step: exit $rc in $((SECONDS - step_start)) s (log $log)")
    if [ "$step" = test ]; then
        summary+=("$(grep -E '[0-9]+ (passed|failed|skipped|errors?)\b.* in [0-9.]+s' "$log" | tail -1)")
    else
        summary+=("$(sed -n '/^targets (/,$p' "$log")")
    fi
done
printf '\n== summary (%s s)\n' "$((SECONDS - start))"
printf '%s\n' "${summary[@]}"
exit $status
