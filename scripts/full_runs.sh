#!/usr/bin/env bash
# The full versions of the papers' experiments (docs/gpu.md), in steps of under 10 minutes each.
#
#   scripts/full_runs.sh STEP...        run the steps in order (see `scripts/full_runs.sh --help`)
#
# Every training is capped with `--set train_minutes=M` and checkpointed in $RUNS/ckpt, so running a step
# again (on the same machine, or after `unpack` on another) continues the trainings it cut short.
# Environment:
#   CAPSNETS_DATA   data root holding mnist/ and fashion-mnist/ (required unless --smoke)
#   RUNS            where checkpoints, reports and logs go (default runs/full; runs/full-smoke with --smoke)
#   DEVICE          default cuda (cpu with --smoke)
#   BUNDLE_DIR      if set, each step ends by writing $BUNDLE_DIR/results.tgz (reports and logs, no checkpoints)
#   PYTHON          the interpreter (default python); src/ is put on PYTHONPATH, so no install is needed
#   DRY_RUN=1       print the commands instead of running them
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    cat <<'EOF'
usage: scripts/full_runs.sh [--smoke] STEP...

steps (the order of docs/gpu.md; each fits a 10-minute command):
  checks                   pytest -m gpu, then the throughput benchmarks (capsnet, cnn_baseline, matrix_capsnet)
                           and routing_products.py
  viewpoints               azimuth and elevation side by side (standardised cost, detached routing gradients,
                           the capsule model at learning rate 3e-3)
  viewpoints-exact         the same with exact routing gradients (the paper's procedure), in its own folders
  segmentation-multimnist  segmentation and multimnist side by side
  segmentation-bn          segmentation with a batch-normed U-Net (if the plain one collapses)
  affnist-synthesis        affnist (most of the command, so the CNN reaches its target) and synthesis
  matrix-mnist             matrix_capsnet on MNIST, 8 minutes at a time, resumed from its last checkpoint
  routers                  every routing_zoo head, seeds 0 1 2, 2.5 minutes of training per seed (MINUTES:
                           time_limit_minutes), continued from $RUNS/ckpt/routers until trainings_left is 0
  pack                     split the viewpoints checkpoints into 15 MB parts under $BUNDLE_DIR/ckpt-parts
  unpack DIR               restore checkpoints packed by `pack` from the parts in DIR into $RUNS/ckpt

--smoke runs each experiment's --smoke version on the CPU (minutes), to check the script itself.
Set MINUTES to override a step's train_minutes.
EOF
}

SMOKE=()
if [[ "${1:-}" == "--smoke" ]]; then
    SMOKE=(--smoke)
    shift
fi
if [[ $# -eq 0 || "$1" == "-h" || "$1" == "--help" ]]; then
    usage
    exit 0
fi
RUNS="${RUNS:-runs/full${SMOKE:+-smoke}}"
DEVICE="${DEVICE:-$([[ ${#SMOKE[@]} -gt 0 ]] && echo cpu || echo cuda)}"
CKPT="$RUNS/ckpt"
DETACHED='capsule_args={"routing":{"detach_routing":true}}'  # the default (official) formulation
EXACT='capsule_args={"routing":{"detach_routing":false}}'
PY="${PYTHON:-python}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
# the capsnets commands keep freed CPU memory for reuse (capsnets --retain-freed-memory); 0 leaves malloc alone
export CAPSNETS_RETAIN_FREED_MEMORY="${CAPSNETS_RETAIN_FREED_MEMORY:-1}"
if [[ ${#SMOKE[@]} -eq 0 && -z "${CAPSNETS_DATA:-}" && -z "${DRY_RUN:-}" ]]; then
    echo "CAPSNETS_DATA is not set: point it at the folder holding mnist/ and fashion-mnist/" >&2
    exit 2
fi
[[ -n "${DRY_RUN:-}" ]] || mkdir -p "$RUNS/logs" "$CKPT"

PIDS=()
NAMES=()

# start NAME CMD...: run CMD in the background, its output in $RUNS/logs/NAME.log
start() {
    local name="$1"
    shift
    if [[ -n "${DRY_RUN:-}" ]]; then
        printf '%q ' "$@"
        echo
        return
    fi
    echo "[$(date +%T)] $name: $*"
    "$@" >"$RUNS/logs/$name.log" 2>&1 &
    PIDS+=($!)
    NAMES+=("$name")
}

# wait_all: wait for everything start()ed; print each log's last lines; fail if any command failed
wait_all() {
    local failed=0 i rc
    for i in "${!PIDS[@]}"; do
        rc=0
        wait "${PIDS[$i]}" || rc=$?
        if [[ $rc -eq 0 ]]; then
            echo "[$(date +%T)] ${NAMES[$i]}: done"
        else
            echo "[$(date +%T)] ${NAMES[$i]}: FAILED (exit $rc)"
            failed=1
        fi
        tail -n 15 "$RUNS/logs/${NAMES[$i]}.log"
    done
    PIDS=()
    NAMES=()
    return $failed
}

# experiment NAME OUT_NAME MINUTES [--set ...]: one `capsnets experiment` run in the background
experiment() {
    local name="$1" out="$2" minutes="${MINUTES:-$3}"
    shift 3
    start "$out" "$PY" -m capsnets experiment "$name" "${SMOKE[@]}" --out "$RUNS/out/$out" --device "$DEVICE" \
        --checkpoint-dir "$CKPT" --set "train_minutes=$minutes" "$@"
}

bundle() {
    if [[ -z "${BUNDLE_DIR:-}" || -n "${DRY_RUN:-}" ]]; then
        return
    fi
    local parts
    parts=$(cd "$RUNS" && ls -d out logs train 2>/dev/null || true)
    mkdir -p "$BUNDLE_DIR"
    # shellcheck disable=SC2086
    tar -czf "$BUNDLE_DIR/results.tgz" --exclude='*.safetensors' -C "$RUNS" $parts
    ls -la "$BUNDLE_DIR"
}

run_step() {
    local step="$1"
    case "$step" in
    checks)
        start pytest-gpu "$PY" -m pytest -m gpu -q
        wait_all || true
        start bench-capsnet "$PY" benchmarks/throughput.py --models capsnet cnn_baseline --batch-sizes 128 \
            --device "$DEVICE" --amp bf16 --steps 20 --warmup 5 --out "$RUNS/out/bench/throughput_bf16.json"
        wait_all || true
        start bench-em "$PY" benchmarks/throughput.py --models matrix_capsnet --batch-sizes 128 --device "$DEVICE" \
            --amp bf16 --steps 10 --warmup 3 --repeats 3 --model-arg checkpoint_chunks=8 --skip-naive \
            --compare-compile --out "$RUNS/out/bench/throughput_em_chunks8_compare_compile.json"
        wait_all || true
        start bench-products "$PY" benchmarks/routing_products.py --device "$DEVICE" --batch-sizes 128 \
            --out "$RUNS/out/bench/routing_products.json"
        wait_all
        ;;
    viewpoints | viewpoints-exact)
        local args="$DETACHED" suffix=""
        if [[ "$step" == viewpoints-exact ]]; then
            args="$EXACT" suffix="_exact"
        fi
        for split in azimuth elevation; do
            experiment viewpoints "viewpoints_$split$suffix" 5.5 --set "splits=[\"$split\"]" --set "$args"
        done
        wait_all
        ;;
    segmentation-multimnist)
        experiment segmentation segmentation 3.5
        experiment multimnist multimnist 3.5
        wait_all
        ;;
    segmentation-bn)
        experiment segmentation segmentation_bn 7 --set 'unet_args={"batch_norm":true}'
        wait_all
        ;;
    affnist-synthesis)
        experiment affnist affnist 6.5
        experiment synthesis synthesis 3.5
        wait_all
        ;;
    matrix-mnist)
        local out="$RUNS/train/matrix_capsnet_mnist" resume=() limits=()
        if [[ -f "$out/last.safetensors" ]]; then
            resume=(--resume)
        fi
        if [[ ${#SMOKE[@]} -gt 0 ]]; then
            limits=(--limit-train 512 --limit-test 256 --epochs 1 --model matrix_capsnet_small)
        else
            limits=(--epochs 50 --model matrix_capsnet --model-arg checkpoint_chunks=8)
        fi
        start matrix-mnist "$PY" -m capsnets train --dataset mnist "${limits[@]}" --device "$DEVICE" \
            --time-limit "${MINUTES:-8}" --no-progress --out "$out" "${resume[@]}"
        wait_all
        ;;
    routers)
        start routers "$PY" -m capsnets experiment routers "${SMOKE[@]}" --out "$RUNS/out/routers" --device "$DEVICE" \
            --checkpoint-dir "$CKPT/routers" --seeds 0 1 2 --set "time_limit_minutes=${MINUTES:-2.5}"
        wait_all
        ;;
    *)
        echo "unknown step $step" >&2
        usage >&2
        return 2
        ;;
    esac
}

# pack: the viewpoints checkpoints (not the "CNN, stopped" ones, which are retrained) as parts of at most 15 MB
pack() {
    local dest="${BUNDLE_DIR:?set BUNDLE_DIR to where the parts should go}/ckpt-parts" files
    files=$(cd "$CKPT" && ls | grep -E 'azimuth|elevation' | grep -v _stopped_at_ || true)
    if [[ -z "$files" ]]; then
        echo "no viewpoints checkpoints in $CKPT" >&2
        return 1
    fi
    mkdir -p "$dest"
    # shellcheck disable=SC2086
    tar -cf - -C "$CKPT" $files | split -b 15M -d - "$dest/ckpt.tar.part-"
    ls -la "$dest"
}

unpack() {
    local src="${1:?unpack needs the folder holding ckpt.tar.part-*}"
    cat "$src"/ckpt.tar.part-* | tar -xf - -C "$CKPT"
    ls -la "$CKPT"
}

while [[ $# -gt 0 ]]; do
    case "$1" in
    pack) pack ;;
    unpack)
        unpack "${2:-}"
        shift
        ;;
    *)
        status=0
        run_step "$1" || status=$?
        bundle # the logs come back from a failed step too
        if [[ $status -ne 0 ]]; then
            echo "step $1 failed (exit $status); its logs are in $RUNS/logs" >&2
            exit $status
        fi
        ;;
    esac
    shift
done
