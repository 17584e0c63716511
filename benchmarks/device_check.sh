#!/usr/bin/env bash
# One prepared check for a machine with GPUs or TPUs (under 8 minutes on one GPU):
#   1. the data_parallel, fsdp and tensor_parallel comparisons (torch's side on gloo/CPU, JAX on the devices);
#   2. a bf16 GPT train step on 1 and N devices: tokens/s and model FLOPs utilisation against the device's
#      bf16 peak; the memory planner against the device's measured peak (benchmarks/device_step.py);
#   3. part of the convolution sweep (benchmarks/conv.py): funcnet's conv2d against raw lax.conv_general_dilated
#      (the lax/ours ratio must stay near 1: the shape rule picks XLA's convolution on accelerators) and torch
#      on the CPU;
#   4. the pipeline (GPipe, 1F1B) and ZeRO 0-3 train steps on every device: the bubble and the bytes per
#      device of each, the ZeRO stages' losses equal (benchmarks/parallel_step.py);
#   5. GPT-2 small in bf16 (benchmarks/gpt_small.py, 2 x 1024 tokens): funcnet's GPT and the converted
#      transformers model on the device, forward and AdamW train step, model FLOPs per second and their fraction
#      of the device's bf16 matmul rate measured in the same run (torch eager beside them on the CPU); the
#      losses are checked against torch's first.
# Each step has its own timeout (300 + 150 + 120 + 150 + 240 s); step 5 has not been timed on a GPU yet, its timeout
# bounds it (its torch rows run on the CPU).
# Where JAX sees no GPU or TPU it says so in one line and exits 0 without running anything.
# Usage: bash benchmarks/device_check.sh            (from anywhere; it cd's to the repository)
#        bash benchmarks/device_check.sh --cpu      step 4 alone, a tiny GPT on 4 simulated CPU devices
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--cpu" ]; then
  JAX_PLATFORMS=cpu timeout 600 python benchmarks/parallel_step.py --cpu 4
  exit $?
fi
backend=$(python -c "import jax; print(jax.default_backend())" 2>/dev/null || echo "none (jax did not start)")
case "$backend" in
  gpu|cuda|rocm|tpu) ;;
  *) echo "device_check: no GPU or TPU here (JAX's backend is ${backend}); nothing to check"; exit 0 ;;
esac
echo "device_check: backend ${backend}, $(python -c 'import jax; print(len(jax.devices()), jax.devices()[0].device_kind)')"
status=0
timeout 300 python -m comparisons data_parallel fsdp tensor_parallel || status=1
timeout 150 python benchmarks/device_step.py || status=1
timeout 120 python benchmarks/conv.py --part sweep --rounds 3 --rows 2 5 11 12 13 14 15 20 22 24 || status=1
timeout 150 python benchmarks/parallel_step.py || status=1
timeout 240 python benchmarks/gpt_small.py --dtypes bf16 --seq 1024 --batch 2 --rounds 3 || status=1
echo "device_check: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
