#!/usr/bin/env bash
# Everything of issue 4 in one device call: build the harness, run the GPU
# tests, compute-sanitizer on a subset, the single-GPU benchmarks and, when
# there are 2+ GPUs, the multi-GPU check and weak scaling. Logs under $OUT.
#   OUT=/tmp/out tests/gpu/run_on_device.sh [stages: build,test,sanitize,bench,multi]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/sokev_out}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PATH="/usr/local/cuda/bin:$PATH"
stages="${1:-build,test,sanitize,bench,multi}"
has() { [[ ",$stages," == *",$1,"* ]]; }
gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if has build; then
  cc/gpu_harness/build.sh 2>&1 | tee "$OUT/build.log" | tail -3 || exit 1
fi
if has test; then
  CUDA_VISIBLE_DEVICES=0 python3 -m pytest -q -x tests/gpu -p no:cacheprovider \
    2>&1 | tee "$OUT/pytest.log" | tail -15
fi
if has sanitize; then
  for tool in memcheck racecheck; do
    CUDA_VISIBLE_DEVICES=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 200 \
      compute-sanitizer --tool $tool --target-processes all --print-limit 20 \
      python3 -m pytest -q tests/gpu -p no:cacheprovider \
      -k "duplicates or default_value or update_rows or row_offsets or (test_unique and 1000-zipf) or (partition and 2-int64) or (combine_forward and sum-37) or (optimizers and 8-adam) or (fused and mean-7-int64) or (unique_segmented and 1000-int64) or (lookup_combine_rows and sum-7) or (backward_apply and sum-37-adagrad) or (backward_apply and sum-128-adagrad) or (backward_apply and mean-8-ftrl)" \
      > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool: rc=$? $(grep -E 'ERROR SUMMARY|passed|failed' "$OUT/sanitizer_$tool.log" | tr '\n' ' ')"
  done
fi
if has bench; then
  (cd benchmarks/gpu && CUDA_VISIBLE_DEVICES=0 python3 bench_core.py 2>&1 | tee "$OUT/bench_core.log";
   CUDA_VISIBLE_DEVICES=0 python3 backward_probe.py 2>&1 | tee "$OUT/backward_probe.log")
fi
if has multi && [ "$gpus" -ge 2 ]; then
  (cd benchmarks/gpu && python3 sparse_step.py --gpus 2 --check --rows-per-gpu 1000000 2>&1 | tee "$OUT/multi_check.log" | grep -E "check|Error|error" ;
   python3 sparse_step.py --gpus 2 --check --overlap --port 29535 --rows-per-gpu 1000000 2>&1 | tee "$OUT/multi_check_overlap.log" | grep -E "check|Error|error" ;
   python3 sparse_step.py --gpus 2 --scaling 2>&1 | tee "$OUT/multi_scaling.log" | grep -E "gpus=|T4|Error|error";
   python3 sparse_step.py --gpus 2 --scaling --overlap --port 29534 2>&1 | tee "$OUT/multi_scaling_overlap.log" | grep -E "gpus=|T4|Error|error")
fi
