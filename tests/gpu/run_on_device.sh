#!/usr/bin/env bash
# The device run: the whole test suite under TensorFlow on a GPU machine,
# against the shipped artifact that tests/gpu/build_device_artifact.sh built
# on the CPU machine (never rebuilt here). One device call.
#
# Setup, from the project's root on the CPU machine:
#   bash ../shared/gpu-tf/prepare.sh          # once per machine: .gpu-tf/
#   bash tests/gpu/build_device_artifact.sh   # per tree: .device/
# Device calls on a fresh GPU machine (see ../shared/gpu-tf/README.md):
#   run(kind="nvidia-h200-x2", command="mkdir -p /tmp/gpu-tf && cp .gpu-tf/part-0/* /tmp/gpu-tf/ && ls /tmp/gpu-tf", carry=[".gpu-tf/part-0"])
#   run(command="cp .gpu-tf/part-1/* /tmp/gpu-tf/ && ls /tmp/gpu-tf", carry=[".gpu-tf/part-1"])
#   run(command="cp .gpu-tf/part-2/* /tmp/gpu-tf/ && ls /tmp/gpu-tf", carry=[".gpu-tf/part-2"])
#   run(command="cp .gpu-tf/part-3/* /tmp/gpu-tf/ && ls /tmp/gpu-tf", carry=[".gpu-tf/part-3"])
#   run(command="cp .gpu-tf/part-4/* /tmp/gpu-tf/ && ls /tmp/gpu-tf", carry=[".gpu-tf/part-4"])
#   run(command="cp .gpu-tf/part-5/* /tmp/gpu-tf/ && ls /tmp/gpu-tf", carry=[".gpu-tf/part-5"])
#   run(command="cp .gpu-tf/part-6/* /tmp/gpu-tf/ && ls /tmp/gpu-tf", carry=[".gpu-tf/part-6"])
#   run(command="bash .gpu-tf/kit/install.sh", carry=[".gpu-tf/kit"])
#   run(command="bash tests/gpu/run_on_device.sh", carry=[".device"], timeout_s=600)
#
# The wheel is installed into a temporary site dir ahead of the kit's
# TensorFlow and every part runs from outside the checkout, so the in-tree
# sok_ev/ cannot shadow it; the logs name the sok_ev file and op library that
# ran, and a TensorFlow part that ran anything else counts as failed.
#   tf        tests/ on GPU 0, without tests/gpu, tests/multiworker and the two
#             checks of the build machine (test_formatting, test_gpu_code_compiles);
#             SOK_EV_TF_TESTS="test_a.py test_b.py" runs only those files;
#             SOK_EV_TF_PROCESSES=3 runs three pytest processes on the GPU (a
#             file each at a time), for a call shared with multi. Carry
#             .whl (tf_keras's wheel) too, or tests/test_legacy_keras.py and
#             the tf_keras cases cannot run: carry=[".device", ".whl"]
#   multi     tests/multiworker/ under horovodrun over NCCL, one GPU per rank
#             (harness.py's GPU mode; launches of more ranks than GPUs skip, so
#             one GPU runs the one-worker cases: the multi-worker pipeline over
#             a one-rank exchange, against the dense reference), 4 launches
#             at a time (SOK_EV_MULTI_PROCESSES, pytest-xdist)
#   harness   tests/gpu/: PyTorch + the ctypes harness, without the kit's paths
#   memcheck  compute-sanitizer memcheck of tests/gpu/tf_memcheck_workload.py
#             with TF_GPU_ALLOCATOR=cuda_malloc_async (one tensor, one allocation)
# With 2+ GPUs, tf runs on GPU 0 while harness and then memcheck run on GPU 1;
# multi follows on all GPUs. Logs in $OUT (6 files); the last line sums up.
#   bash tests/gpu/run_on_device.sh [PARTS]     PARTS: tf,multi,harness,memcheck
# Two more parts run only when named, each in a call of its own (time):
#   harness-sanitizer  compute-sanitizer memcheck and racecheck of a subset of
#                      tests/gpu/ (the core through the harness)
#   bench              benchmarks/gpu/ (core, backward probe; with 2+ GPUs the
#                      2-GPU checks and weak scaling), harness library of .device/
#   tf-bench           benchmarks/gpu/tf_sparse_step.py on GPU 0 with the
#                      artifact (its results also land in $OUT); its
#                      arguments from $SOK_EV_TF_BENCH_ARGS (e.g.
#                      "--table-streams 1,8,16")
#   tf-tiered          benchmarks/gpu/tf_tiered_step.py on GPU 0: the step with
#                      HBM budgets of 50/25/10% of the tables' state against
#                      all-HBM (arguments from $SOK_EV_TF_TIERED_ARGS)
#   tf-tiered-capacity benchmarks/gpu/tf_tiered_capacity.py on GPU 0 (issue 50):
#                      26 tables whose values and Adagrad slots are 1.3x the
#                      GPU's memory, 62% of them in HBM budgets and the rest in
#                      host memory, filled, then 50 timed steps (arguments from
#                      $SOK_EV_TF_CAPACITY_ARGS, e.g. "--times 1.5
#                      --hbm-fraction 0.5"); it refuses, naming the numbers,
#                      when MemAvailable cannot hold the host share. Log
#                      tf-tiered-capacity.log, results tf_tiered_capacity_results.md
#                      and tf_tiered_capacity.json in $OUT
#   tf-scaling         benchmarks/gpu/tf_weak_scaling.py: the TF step on 1 and
#                      2 GPUs under horovodrun over NCCL, the 2-vs-1 check
#                      (results and the ranks' JSON in $OUT); on one GPU, the
#                      fused step against the multi-worker pipeline on one rank
#   peers              sok-ev against NVIDIA SOK 2.1.0 (benchmarks/peers/): the
#                      step of sok_vs_sok_ev.py per implementation on GPU 0
#                      while feature_probe.py runs on GPU 1, then each step
#                      under horovodrun -np 2 (one GPU: the probe after the
#                      timings, no 2-GPU runs); needs .peers/ carried too
#                      (benchmarks/peers/build_sok.sh): carry=[".device", ".peers"].
#                      SOK kinds whose sok_smoke.py step crashes are not timed;
#                      their cuda-gdb backtraces and compute-sanitizer
#                      reports go to peers_smoke.log
#                      Outputs peers.log, peers_results.md, probe.md (and
#                      peers_smoke.log when SOK crashes) in $OUT
#   criteo             benchmarks/criteo/run.py --device gpu (DLRM, batch
#                      65536, sok-ev 2048 steps, the baseline 128) on GPU 0;
#                      out dir $OUT/criteo_gpu1 (results_line.md, run.json)
#   criteo-scaling     sok-ev's Criteo rate on GPU 0, then under horovodrun
#                      -np 2 over NCCL at the same 65536 a GPU (512 steps
#                      each); needs 2 GPUs; out dirs $OUT/criteo_scaling1, 2
#   criteo-mlperf      benchmarks/criteo/run.py --device gpu --model dcnv2
#                      --hotness mlperf (MLPerf DLRM-DCNv2's shape and hotness,
#                      both implementations; 512 steps, the baseline 64) on
#                      GPU 0, then sok-ev alone with a bfloat16 tower that
#                      XLA compiles (--xla-tower); out
#                      dirs $OUT/criteo_mlperf and criteo_mlperf_bf16, log
#                      criteo-mlperf.log
#   criteo-gpu-batches run.py's MLPerf step (sok-ev alone, bfloat16, XLA tower,
#                      40 steps) with batches from tf.data in host memory,
#                      then built by each step in GPU memory
#                      (--batches-on-gpu); log criteo-gpu-batches.log
#   criteo-split       benchmarks/gpu/criteo_step_split.py --mlperf --trace on GPU 0:
#                      where MLPerf DLRM-DCNv2's step goes (tower, lookup,
#                      sparse update, floor; one traced call of each part,
#                      its ops by kernel time); log criteo-split.log
# Dry run on a CPU machine (no kit; TensorFlow parts on the CPU, multi over
# Gloo, harness and memcheck reduced to what runs without a GPU):
#   SOK_EV_DEVICE_DRY_RUN=1 PYTHON=.venv-cuda/bin/python bash tests/gpu/run_on_device.sh
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:-/tmp/sokev_out}
mkdir -p "$OUT"
parts=${1:-tf,multi,harness,memcheck}
dry=${SOK_EV_DEVICE_DRY_RUN:-0}
# A device call may run 600 s; parts are cut to fit what is left.
deadline=$((SECONDS + ${SOK_EV_DEVICE_BUDGET_S:-570}))
has() { [[ ",$parts," == *",$1,"* ]]; }
log() { echo "$*" | tee -a "$OUT/env.log"; }
: >"$OUT/env.log"

plain_pythonpath=${PYTHONPATH:-} plain_ld_library_path=${LD_LIBRARY_PATH:-}
if ((dry)); then
    PY=${PYTHON:-python3}
    # Parts run from other directories: a relative path must not break.
    [[ $PY == */* && $PY != /* ]] && PY=$PWD/$PY
    log "DRY RUN on the CPU with $PY"
else
    # shellcheck disable=SC1091
    source /tmp/gpu-tf/env.sh 2>/dev/null || {
        echo "no /tmp/gpu-tf/env.sh: install the gpu-tf kit first (see the header of $0)" >&2
        exit 2
    }
    PY=python3
fi
export TF_CPP_MIN_LOG_LEVEL=2 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Several processes share each GPU (pytest and the ranks it starts).
export TF_FORCE_GPU_ALLOW_GROWTH=true
gpus=0
command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
((gpus)) && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$OUT/env.log"
status=$(mktemp -d) site="" run=""
trap 'rm -rf "$status" "$site" "$run"' EXIT

# --- the artifact --------------------------------------------------------------
# SOK_EV_DEVICE_ARTIFACT: another artifact folder (an earlier tree's, carried
# beside .device, for a before/after benchmark in one call).
artifact=${SOK_EV_DEVICE_ARTIFACT:-$root/.device}
[[ $artifact == /* ]] || artifact=$root/$artifact
shopt -s nullglob
wheels=("$artifact"/wheel/*.whl)
if ((${#wheels[@]} != 1)) || [[ ! -f $artifact/MANIFEST ]]; then
    echo "no $artifact artifact: run tests/gpu/build_device_artifact.sh here and carry .device" >&2
    exit 2
fi
cat "$artifact/MANIFEST" >>"$OUT/env.log"
(cd "$artifact" && grep -E '^[0-9a-f]{64}  (wheel|harness)/' MANIFEST | sha256sum -c --quiet) || {
    log "artifact does not match its MANIFEST"
    exit 2
}
site=$(mktemp -d /tmp/sokev_site.XXXX)
run=$(mktemp -d /tmp/sokev_run.XXXX)
"$PY" -m pip install -q --no-deps --no-index --no-compile --target "$site" "${wheels[0]}" >>"$OUT/env.log" 2>&1 || {
    log "pip could not install ${wheels[0]}"
    exit 2
}
# Test-only wheels the kit lacks (tf_keras for tests/test_legacy_keras.py and
# the tf_keras cases), carried in .whl/ (git-ignored): carry=[".device", ".whl"].
extra=("$root"/.whl/*.whl)
if ((${#extra[@]})); then
    "$PY" -m pip install -q --no-deps --no-index --no-compile --target "$site" "${extra[@]}" \
        >>"$OUT/env.log" 2>&1 || log "pip could not install ${extra[*]}"
fi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
(cd "$run" && "$PY" - "$site" <<'EOF') 2>&1 | tee -a "$OUT/env.log" | grep -E '^(sok_ev|ERROR)'
import hashlib, importlib.metadata as md, sys
import tensorflow as tf
import sok_ev, sok_ev._ops as o
site = sys.argv[1]
o.ops()
with open(o.LIBRARY_PATH, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:16]
print(f"python {sys.version.split()[0]}, tensorflow {tf.__version__} (CUDA build "
      f"{tf.test.is_built_with_cuda()}), GPUs {len(tf.config.list_physical_devices('GPU'))}")
for name in ("horovod", "torch", "pytest", "pytest-timeout"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} not installed")
print(f"sok_ev {sok_ev.__file__}")
print(f"sok_ev op library {o.LIBRARY_PATH} sha256 {digest}: {o.describe_build(o.build_info())}")
if not sok_ev.__file__.startswith(site):
    print(f"ERROR: sok_ev came from {sok_ev.__file__}, not the artifact in {site}")
    sys.exit(1)
EOF
((${PIPESTATUS[0]} == 0)) || {
    log "the artifact does not import (see $OUT/env.log)"
    exit 1
}

# --- the parts -----------------------------------------------------------------
limit() { # limit SECONDS: the part's own limit, or what is left of the budget
    local left=$((deadline - SECONDS - 5))
    ((left < $1)) && echo "$left" || echo "$1"
}
pytest_part() { # pytest_part NAME LIMIT_S PYTEST_ARGS...: runs from $run, logs $OUT/NAME.log
    local name=$1 seconds
    seconds=$(limit "$2")
    shift 2
    if ((seconds < 30)); then
        echo "not run: no time left" >"$OUT/$name.log"
    else
        (cd "$run" && timeout -k 10 "$seconds" "$PY" -m pytest -p no:cacheprovider --rootdir "$root" -rfEs "$@") \
            >"$OUT/$name.log" 2>&1
        echo "$?" >"$status/$name.rc"
    fi
    echo "$name: $(tail -1 "$OUT/$name.log")"
}
part_tf() {
    # SOK_EV_TF_TESTS (files under tests/, space-separated) narrows the part
    # to those files, for a short call after a small change.
    # SOK_EV_TF_PROCESSES > 1 runs that many pytest processes on the GPU, a
    # file each at a time (pytest-xdist), when the part shares its call.
    local targets=("$root/tests") name processes=${SOK_EV_TF_PROCESSES:-1} parallel=()
    ((processes > 1)) && "$PY" -c "import xdist" 2>/dev/null && parallel=(-n "$processes" --dist loadfile)
    if [[ -n ${SOK_EV_TF_TESTS:-} ]]; then
        targets=()
        for name in $SOK_EV_TF_TESTS; do targets+=("$root/tests/$name"); done
    fi
    CUDA_VISIBLE_DEVICES=$1 pytest_part tf 540 "${parallel[@]}" "${targets[@]}" --ignore="$root/tests/gpu" \
        --ignore="$root/tests/multiworker" --ignore="$root/tests/test_formatting.py" \
        --ignore="$root/tests/test_gpu_code_compiles.py"
}
part_harness() {
    # PyTorch's process gets none of the kit's TensorFlow paths.
    PYTHONPATH=$plain_pythonpath LD_LIBRARY_PATH=$plain_ld_library_path CUDA_VISIBLE_DEVICES=$1 \
        SOKEV_GPU_LIB=$artifact/harness/libsokev_gpu.so pytest_part harness 150 "$root/tests/gpu"
}
part_memcheck() {
    local seconds workload=("$PY" "$root/tests/gpu/tf_memcheck_workload.py")
    seconds=$(limit 270)
    ((dry)) && workload+=(--allow-cpu)
    if ((seconds < 60)); then
        echo "not run: no time left" >"$OUT/memcheck.log"
    elif ((dry)); then
        (cd "$run" && timeout -k 10 "$seconds" "${workload[@]}") >"$OUT/memcheck.log" 2>&1
        echo "$?" >"$status/memcheck.rc"
    else
        # API errors are TensorFlow's own probing; memcheck reports accesses.
        (cd "$run" && CUDA_VISIBLE_DEVICES=$1 TF_GPU_ALLOCATOR=cuda_malloc_async CUDA_MODULE_LOADING=LAZY \
            timeout -k 10 "$seconds" compute-sanitizer --tool memcheck --report-api-errors no \
            --print-limit 30 --error-exitcode 99 "${workload[@]}") >"$OUT/memcheck.log" 2>&1
        echo "$?" >"$status/memcheck.rc"
    fi
    echo "memcheck: $(grep -E 'ERROR SUMMARY|workload done' "$OUT/memcheck.log" | tr '\n' ' ')"
}
part_multi() {
    # A stuck launch fails its own test, every rank printing its stacks at
    # its deadline (harness.arm_rank_deadline), instead of eating the part's
    # time. The tests run SOK_EV_MULTI_PROCESSES at a time (pytest-xdist);
    # each rank has its own GPU within its launch, and launches share the GPUs.
    # SOK_EV_MULTI_K narrows it to pytest's -k expression (a re-run of failures).
    local processes=${SOK_EV_MULTI_PROCESSES:-4} parallel=()
    ((processes > 1)) && "$PY" -c "import xdist" 2>/dev/null && parallel=(-n "$processes")
    SOK_EV_MULTIWORKER_GPUS=$gpus pytest_part multi 540 --timeout 300 --durations 0 \
        "${parallel[@]}" "$root/tests/multiworker" ${SOK_EV_MULTI_K:+-k "$SOK_EV_MULTI_K"}
}
torch_env() { # torch_env COMMAND...: PyTorch's process, without the kit's paths
    PYTHONPATH=$plain_pythonpath LD_LIBRARY_PATH=$plain_ld_library_path \
        SOKEV_GPU_LIB=$artifact/harness/libsokev_gpu.so "$@"
}
part_harness_sanitizer() {
    local tool rc=0 subset="duplicates or default_value or update_rows or row_offsets or (test_unique and 1000-zipf) or (partition and 2-int64) or (combine_forward and sum-37) or (optimizers and 8-adam) or (fused and mean-7-int64) or (unique_segmented and 1000-int64) or (unique_of_sorted and 2-int64) or unique_of_runs_flags or (lookup_combine_rows and sum-7) or (backward_apply and sum-37-adagrad) or (backward_apply and sum-128-adagrad) or (backward_apply and mean-8-ftrl)"
    : >"$OUT/harness-sanitizer.log"
    for tool in memcheck racecheck; do
        (cd "$run" && torch_env env CUDA_VISIBLE_DEVICES=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
            timeout -k 10 "$(limit 240)" compute-sanitizer --tool "$tool" --target-processes all \
            --print-limit 20 --error-exitcode 99 "$PY" -m pytest -q -p no:cacheprovider \
            "$root/tests/gpu" -k "$subset") >>"$OUT/harness-sanitizer.log" 2>&1 || rc=1
    done
    # Tests skipped (no torch, no GPU) would make a clean report meaningless.
    [[ $(grep -c ' passed' "$OUT/harness-sanitizer.log") == 2 ]] || rc=1
    echo "$rc" >"$status/harness-sanitizer.rc"
    echo "harness-sanitizer: $(grep -E 'ERROR SUMMARY' "$OUT/harness-sanitizer.log" | tr '\n' ' ')"
}
part_bench() {
    local rc=0 command exit_code
    local commands=("bench_core.py" "backward_probe.py")
    ((gpus >= 2)) && commands+=("sparse_step.py --gpus 2 --check --rows-per-gpu 1000000"
        "sparse_step.py --gpus 2 --check --overlap --port 29535 --rows-per-gpu 1000000"
        "sparse_step.py --gpus 2 --scaling"
        "sparse_step.py --gpus 2 --scaling --overlap --port 29534")
    : >"$OUT/bench.log"
    for command in "${commands[@]}"; do
        echo "=== $command" >>"$OUT/bench.log"
        # shellcheck disable=SC2086
        (cd "$root/benchmarks/gpu" && torch_env timeout -k 10 "$(limit 300)" "$PY" $command) \
            >>"$OUT/bench.log" 2>&1
        exit_code=$?
        ((exit_code == 0)) || { rc=1; echo "=== exit $exit_code: $command" >>"$OUT/bench.log"; }
    done
    echo "$rc" >"$status/bench.rc"
    echo "bench: $(grep -cE '^=== exit' "$OUT/bench.log") of ${#commands[@]} commands failed"
}

part_peers() { # sok-ev and SOK, one implementation a process (benchmarks/peers/README.md)
    local impl rc=0 peers=$root/benchmarks/peers probe_pid="" small=()
    local sok_ok=1 impls=(sok_ev sok_dynamic sok_static)
    : >"$OUT/peers.log"
    if [[ ! -f $root/.peers/MANIFEST ]] || ! (cd "$root/.peers" && grep -E '^[0-9a-f]{64}  sok/' MANIFEST |
        sha256sum -c --quiet) >>"$OUT/peers.log" 2>&1; then
        echo "=== no .peers/ artifact matching its MANIFEST: SOK not run" >>"$OUT/peers.log"
        sok_ok=0 rc=1
    fi
    # A dry run's numbers stay out of benchmarks/RESULTS.md.
    ((dry)) && { sok_ok=0 rc=0 small=(--batch 256 --rows 26000 --steps 3 --results "$OUT/RESULTS.dry.md"); }
    ((sok_ok)) || impls=(sok_ev)
    ((sok_ok)) && cat "$root/.peers/MANIFEST" >>"$OUT/peers.log"
    # SOK's package: its __init__ finds its libraries in <path entry>/sparse_operation_kit/lib.
    export PYTHONPATH=$root/.peers/sok:$PYTHONPATH
    peers_run() { # peers_run LIMIT_S COMMAND...: appends to peers.log, counts failures
        echo "=== $*" >>"$OUT/peers.log"
        (cd "$run" && timeout -k 10 "$(limit "$1")" "${@:2}") >>"$OUT/peers.log" 2>&1 ||
            { echo "=== exit $?: ${*:2}" >>"$OUT/peers.log"; return 1; }
    }
    # SOK's smallest step per variable kind first (benchmarks/peers/sok_smoke.py).
    # A kind that crashes is re-run under cuda-gdb, its native frames, registers
    # and faulting instructions going to peers_smoke.log, and is not timed.
    local timed=(sok_ev) kind
    if ((sok_ok)); then
        for kind in static hbm hybrid; do
            if CUDA_VISIBLE_DEVICES=0 peers_run 60 "$PY" "$peers/sok_smoke.py" "$kind"; then
                [[ $kind == static ]] && timed+=(sok_static)
                [[ $kind == hybrid ]] && timed+=(sok_dynamic)
                [[ $kind == hbm ]] && timed+=(sok_dynamic_det)
            else
                rc=1
                echo "=== $kind under cuda-gdb" >>"$OUT/peers_smoke.log"
                (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 150)" cuda-gdb -batch \
                    -ex run -ex "bt 40" -ex "info registers" -ex 'x/6i $pc' \
                    --args "$PY" "$peers/sok_smoke.py" "$kind") >>"$OUT/peers_smoke.log" 2>&1
                # A SOK op's C++ exception reaches TensorFlow's pybind11 without
                # the GIL and dies there unread (HKV's training step); a bad
                # access inside it shows here. (cuda-gdb's `catch throw` stops
                # at benign throws while importing: jaxlib, matplotlib.)
                echo "=== $kind under compute-sanitizer" >>"$OUT/peers_smoke.log"
                (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 150)" compute-sanitizer \
                    --report-api-errors no --print-limit 5 "$PY" "$peers/sok_smoke.py" "$kind") \
                    >>"$OUT/peers_smoke.log" 2>&1
            fi
        done
    fi
    if ((gpus >= 2 || dry)); then
        ( for impl in "${impls[@]}"; do
            (cd "$run" && CUDA_VISIBLE_DEVICES=$other_gpu timeout -k 10 "$(limit 120)" "$PY" \
                "$peers/feature_probe.py" --impl "$impl" --json-dir "$OUT" $( ((dry)) && echo --allow-cpu))
        done ) >"$OUT/probe.log" 2>&1 &
        probe_pid=$!
    fi
    for impl in "${timed[@]}"; do
        CUDA_VISIBLE_DEVICES=0 peers_run 150 "$PY" "$peers/sok_vs_sok_ev.py" --impl "$impl" \
            --json-dir "$OUT" "${small[@]}" $( ((dry)) && echo --dry-run-on-cpu) || rc=1
    done
    [[ -n $probe_pid ]] && wait "$probe_pid"
    if ((gpus < 2 && !dry)); then # one GPU: the probe after the timings, on the same GPU
        for impl in "${impls[@]}"; do
            (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 120)" "$PY" \
                "$peers/feature_probe.py" --impl "$impl" --json-dir "$OUT")
        done >"$OUT/probe.log" 2>&1
    fi
    if ((gpus >= 2)) || { ((dry)) && command -v horovodrun >/dev/null; }; then
        local launch=("$root/tests/multiworker/one_gpu_per_rank.sh")
        ((dry)) && launch=()
        for impl in "${timed[@]}"; do
            peers_run 150 horovodrun --gloo -np 2 -H localhost:2 "${launch[@]}" "$PY" \
                "$peers/sok_vs_sok_ev.py" --impl "$impl" --json-dir "$OUT" "${small[@]}" \
                $( ((dry)) && echo --dry-run-on-cpu) || rc=1
        done
    else
        echo "=== one GPU: no 2-GPU runs" >>"$OUT/peers.log"
    fi
    peers_run 30 "$PY" "$peers/sok_vs_sok_ev.py" --report --json-dir "$OUT" "${small[@]}" || rc=1
    peers_run 30 "$PY" "$peers/feature_probe.py" --report --json-dir "$OUT" || rc=1
    echo "$rc" >"$status/peers.rc"
    echo "peers: $(grep -cE '^=== exit' "$OUT/peers.log") commands failed; $(ls "$OUT"/peers_*gpu.json 2>/dev/null | wc -l) timings"
}

other_gpu=0
((gpus >= 2)) && other_gpu=1
if has tf && ((other_gpu)); then
    part_tf 0 &
    tf_pid=$!
else
    has tf && part_tf 0
fi
has harness && part_harness "$other_gpu"
has memcheck && part_memcheck "$other_gpu"
[[ -n ${tf_pid:-} ]] && wait "$tf_pid"
has multi && part_multi
has harness-sanitizer && part_harness_sanitizer
has bench && part_bench
if has tf-bench; then
    (cd "$run" && CUDA_VISIBLE_DEVICES=0 SOKEV_GPU_LIB=$artifact/harness/libsokev_gpu.so \
        timeout -k 10 "$(limit 560)" "$PY" "$root/benchmarks/gpu/tf_sparse_step.py" \
            ${SOK_EV_TF_BENCH_ARGS:-}) \
        >"$OUT/tf-bench.log" 2>&1
    echo "$?" >"$status/tf-bench.rc"
    echo "tf-bench: exit $(cat "$status/tf-bench.rc")"
fi

if has tf-tiered; then
    # shellcheck disable=SC2086
    (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 560)" "$PY" \
        "$root/benchmarks/gpu/tf_tiered_step.py" --json-dir "$OUT" \
        $( ((dry)) && echo --dry-run-on-cpu --fractions 1 --batch 256 --rows 52000 --steps 3 \
            --results "$OUT/RESULTS.dry.md") ${SOK_EV_TF_TIERED_ARGS:-}) \
        >"$OUT/tf-tiered.log" 2>&1
    echo "$?" >"$status/tf-tiered.rc"
    echo "tf-tiered: exit $(cat "$status/tf-tiered.rc")"
fi

if has tf-tiered-capacity; then
    capacity=("$root/benchmarks/gpu/tf_tiered_capacity.py" --json-dir "$OUT")
    # A dry run: tiny tables on the CPU without tiers, its numbers kept out of
    # benchmarks/RESULTS.md.
    ((dry)) && capacity+=(--dry-run-on-cpu --rows-per-table 2000 --batch 256 --steps 50
        --fill-chunk 500 --results "$OUT/RESULTS.dry.md")
    # shellcheck disable=SC2206
    capacity+=(${SOK_EV_TF_CAPACITY_ARGS:-})
    (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 560)" "$PY" "${capacity[@]}") \
        >"$OUT/tf-tiered-capacity.log" 2>&1
    echo "$?" >"$status/tf-tiered-capacity.rc"
    echo "tf-tiered-capacity: exit $(cat "$status/tf-tiered-capacity.rc")"
fi

if has tf-scaling; then
    # The ranks' files go to a folder of their own ($OUT brings back 8 files).
    scaling=("$root/benchmarks/gpu/tf_weak_scaling.py" --json-dir "$OUT/tf-scaling")
    # One GPU: the fused step against the multi-worker pipeline on one rank.
    ((gpus < 2 && !dry)) && scaling+=(--gpus 1)
    # A dry run's numbers stay out of benchmarks/RESULTS.md.
    ((dry)) && scaling+=(--dry-run-on-cpu --batch 256 --rows 52000 --steps 3 --check-batch 64
        --check-rows 5200 --results "$OUT/RESULTS.dry.md")
    # Extra arguments: $SOK_EV_TF_SCALING_ARGS (e.g. "--variants SOK_EV_ROW_TRANSPORT=nccl").
    # shellcheck disable=SC2206
    scaling+=(${SOK_EV_TF_SCALING_ARGS:-})
    seconds=$(limit 560)
    # The driver skips its optional launches rather than be killed before its report.
    (cd "$run" && timeout -k 10 "$seconds" "$PY" "${scaling[@]}" --budget-s $((seconds - 20))) \
        >"$OUT/tf-scaling.log" 2>&1
    echo "$?" >"$status/tf-scaling.rc"
    echo "tf-scaling: exit $(cat "$status/tf-scaling.rc" 2>/dev/null)"
fi

if has peers; then
    part_peers
fi

if has criteo; then
    # The GPU defaults: batches made in memory, sok-ev 2048 steps, the baseline 128.
    (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 300)" "$PY" \
        "$root/benchmarks/criteo/run.py" --device gpu --no-progress --out-dir "$OUT/criteo_gpu1") \
        >"$OUT/criteo.log" 2>&1
    echo "$?" >"$status/criteo.rc"
    echo "criteo: exit $(cat "$status/criteo.rc")"
fi

if has criteo-scaling; then
    # sok-ev's rate on one GPU and on two under horovodrun at the same 65536 a
    # GPU, 512 steps each (a rate, not an AUC: the whole default run of each
    # would not fit one call).
    scaling_run=("$root/benchmarks/criteo/run.py" --device gpu --no-progress --impl sok_ev)
    (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 200)" "$PY" "${scaling_run[@]}" \
        --train-lines $((512 * 65536)) --out-dir "$OUT/criteo_scaling1") >"$OUT/criteo-scaling.log" 2>&1
    rc=$?
    if ((gpus < 2 && !dry)); then
        echo "=== one GPU: no 2-GPU run" >>"$OUT/criteo-scaling.log"
        rc=1
    elif ((rc == 0)); then
        hvd_launch=(horovodrun --gloo -np 2 -H localhost:2)
        ((dry)) && ! command -v horovodrun >/dev/null && hvd_launch=()
        (cd "$run" && timeout -k 10 "$(limit 300)" "${hvd_launch[@]}" "$PY" "${scaling_run[@]}" \
            --batch 131072 --train-lines $((512 * 131072)) --out-dir "$OUT/criteo_scaling2") \
            >>"$OUT/criteo-scaling.log" 2>&1
        rc=$?
    fi
    echo "$rc" >"$status/criteo-scaling.rc"
    echo "criteo-scaling: exit $rc"
fi

if has criteo-mlperf; then
    # A rate, not an AUC, is its target: 512 steps of 65536, the baseline 64.
    mlperf=("$root/benchmarks/criteo/run.py" --device gpu --no-progress --model dcnv2 --hotness mlperf
        --train-lines $((512 * 65536)) --baseline-steps 64)
    (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 270)" "$PY" "${mlperf[@]}" \
        --out-dir "$OUT/criteo_mlperf") >"$OUT/criteo-mlperf.log" 2>&1
    rc=$?
    if ((rc == 0)); then
        (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 200)" "$PY" "${mlperf[@]}" \
            --impl sok_ev --compute-dtype bfloat16 --xla-tower --out-dir "$OUT/criteo_mlperf_bf16") \
            >>"$OUT/criteo-mlperf.log" 2>&1
        rc=$?
    fi
    echo "$rc" >"$status/criteo-mlperf.rc"
    echo "criteo-mlperf: exit $rc"
fi

if has criteo-gpu-batches; then
    # The same 40 steps twice: batches from tf.data in host memory
    # (--no-batches-on-gpu), then built by each step from arrays in GPU
    # memory (--batches-on-gpu, run.py's default where the arrays fit).
    steps40=("$root/benchmarks/criteo/run.py" --device gpu --no-progress --model dcnv2 --hotness mlperf
        --impl sok_ev --compute-dtype bfloat16 --xla-tower --train-lines $((40 * 65536))
        --eval-lines 65536 --evals 1 --no-append)
    rc=0
    for variant in host gpu; do
        ((rc == 0)) || break
        extra=(--no-batches-on-gpu)
        [[ $variant == gpu ]] && extra=(--batches-on-gpu)
        (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 200)" "$PY" "${steps40[@]}" \
            "${extra[@]}" --out-dir "$OUT/criteo_batches_$variant") >>"$OUT/criteo-gpu-batches.log" 2>&1
        rc=$?
    done
    echo "$rc" >"$status/criteo-gpu-batches.rc"
    echo "criteo-gpu-batches: exit $rc"
fi

if has criteo-split; then
    (cd "$run" && CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$(limit 300)" "$PY" \
        "$root/benchmarks/gpu/criteo_step_split.py" --mlperf --trace) >"$OUT/criteo-split.log" 2>&1
    echo "$?" >"$status/criteo-split.rc"
    echo "criteo-split: exit $(cat "$status/criteo-split.rc")"
fi

# --- summary -------------------------------------------------------------------
"$PY" - "$OUT" "$status" "$site" "$parts" "$dry" <<'EOF' | tee "$OUT/summary.txt"
import os, re, sys
out, status, site, parts, dry = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(","), sys.argv[5] == "1"
total = {"passed": 0, "failed": 0, "skipped": 0}
lines = []
for part in ["tf", "multi", "harness", "memcheck", "harness-sanitizer", "bench", "tf-bench",
             "tf-tiered", "tf-tiered-capacity", "tf-scaling", "peers", "criteo", "criteo-scaling",
             "criteo-mlperf", "criteo-split", "criteo-gpu-batches"]:
    if part not in parts:
        continue
    path = os.path.join(out, part + ".log")
    text = open(path, errors="replace").read() if os.path.exists(path) else "not run"
    rc_path = os.path.join(status, part + ".rc")
    rc = int(open(rc_path).read()) if os.path.exists(rc_path) else None
    count = {"passed": 0, "failed": 0, "skipped": 0}
    notes = []
    if part == "memcheck":
        clean = rc == 0 and "workload done on" in text and (dry or "ERROR SUMMARY: 0 errors" in text)
        count["passed" if clean else "failed"] = 1
        if not clean:
            notes.append(f"exit {rc}")
    elif part in ("harness-sanitizer", "bench", "tf-bench", "tf-tiered", "tf-tiered-capacity",
                  "tf-scaling", "peers", "criteo", "criteo-scaling", "criteo-mlperf",
                  "criteo-split", "criteo-gpu-batches"):
        count["passed" if rc == 0 else "failed"] = 1
    else:
        summary = [l for l in text.splitlines() if re.match(r"^=+ .* in [\d.]+s", l)]
        if summary:
            for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", summary[-1]):
                count["failed" if word.startswith(("failed", "error")) else word] += int(n)
        else:
            count["failed"] += 1
            notes.append(f"no pytest summary (exit {rc}): {text.strip().splitlines()[-1:]}")
        if rc not in (0, None) and not count["failed"]:
            count["failed"] += 1
            notes.append(f"pytest exit {rc}")
        if part in ("tf", "multi") and f"sok_ev under test: {site}" not in text:
            count["failed"] += 1
            notes.append("the artifact was not the sok_ev under test")
        if part in ("tf", "harness") and count["skipped"] and not dry:
            notes.append(f"{count['skipped']} skipped on the GPU machine, counted as failed")
            count["failed"] += count.pop("skipped")
            count["skipped"] = 0
    for k in total:
        total[k] += count[k]
    lines.append(f"{part}: {count['passed']} passed, {count['failed']} failed, "
                 f"{count['skipped']} skipped" + (f" ({'; '.join(notes)})" if notes else ""))
print("\n".join(lines))
print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
EOF
