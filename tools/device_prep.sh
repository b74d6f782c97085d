#!/usr/bin/env bash
# Prepares what the GPU suite needs on a device machine that has no network and takes at most
# 64 MiB a call (the H200 of the development sessions), after ../shared/tools/gpu-prep made
# .gpu/p1 and .gpu/p2 (MLX's CUDA wheels in two parts):
#   .gpu/td/node.tar.xz  the ONNX node tests for the conformance runner (49 MB -> ~2 MB)
#   .gpu/wheels/         onnxruntime-genai (the model builder), onnx-ir and mlx-lm for
#                        Python 3.12, from PyPI, for scripts/gpu-bench
# Run from the project root after scripts/setup. Then, calls back to back (the machine keeps
# /tmp only while it stays warm, ~30 s after a call):
#   1. carry [.gpu/p1]:  cp .gpu/p1/part00 /tmp/mlxcuda.part00
#   2. carry [.gpu/p2, .gpu/td, .gpu/wheels, .deps/libonnxruntime-dev]:
#      source .gpu/p2/install.sh && mkdir -p /tmp/td && xz -dc .gpu/td/node.tar.xz | tar x -C /tmp/td &&
#      { GPU_BENCH_GEN_ONLY=1 scripts/gpu-bench $OUT > $OUT/gen.log 2>&1 & } ;
#      GPU_TEST_PARTS=conformance GPU_TEST_DEVICES=gpu CONFORMANCE_JOBS=16 CONFORMANCE_LIMIT=480 \
#        CONFORMANCE_DATA=/tmp/td/node scripts/gpu-test $OUT; wait
#      (builds build-gpu, ~35 s; the GPU conformance run alone 279-330 s; the models ~30 s each
#      when not starved: do not `nice` the generation, and keep it a child of this shell so that
#      `wait` waits for it; a `pgrep -f` for it would match the call's own command line)
#   3. same carry: source .gpu/p2/install.sh && scripts/gpu-bench $OUT/fp16 --only llm
#      --baselines mlx-lm,torch --models /tmp/gpu-models/llama-fp16 --repeat 3
#      --prefill 128,1024 --decode 128,1024 --case-timeout 180
#      (install.sh sets PYTHONPATH to MLX's CUDA wheel: add to it, never replace it; bench.md's
#      "EP statistics" must show 0 runs touching a zero-size array, or a prompt ran on the CPU)
#   4. same carry: ... --baselines cpu,mlx-lm --models /tmp/gpu-models/llama-int4 --case-timeout 200
#      (the torch baseline skips int4 checkpoints)
# Where the conformance table is already current, call 2 can be the build alone
# (GPU_TEST_PARTS=build scripts/gpu-test $OUT) followed by call 3's bench in the same call:
# gpu-bench generates the models it misses (~30 s each).
# Each call must start within ~30 s of the last one's end, or the machine (and /tmp) is gone.
# ORT's CPU EP cannot decode the fp16 model, hence no cpu baseline for it. The fp16 logits of
# a GPU setting against the CPU device (which computes half models in float32), on the same
# tokens:
#      PYTHONPATH=python:$PYTHONPATH python3 tools/decode_steps.py /tmp/gpu-models/llama-fp16 --device gpu
#        --settings "device=cpu,ORT_MLX_ZERO_BIAS=1;ORT_MLX_ZERO_BIAS=1;ORT_MLX_ZERO_BIAS=0"
#        --context 1024 --rounds 1 --steps 16 --teacher-forced
# (open after 2026-12-02: whether MLX's one-row attention, taken since the zero bias is left
# out, is closer to that reference than the fallback it replaced; they differ by up to 0.27).
# Also open after 2026-12-02, never measured on the GPU: the shape family's step order
#      ... --settings "ORT_MLX_STEP_ORDER=1;ORT_MLX_STEP_ORDER=0" --context 1024 --rounds 2 --steps 40
# (on the CPU: 8.3 vs 23.2 segment calls a run, 739 vs 828 arrays), then the oracle shards and
# GPU conformance on the current code (the last oracle ran on 8de3230, conformance on 1d4d491).
# A machine start costs ~90 s of device time: keep ~150 s for the last call. A/Bs of one change
# in one process, e.g.
#      PYTHONPATH=python:$PYTHONPATH python3 tools/decode_steps.py /tmp/gpu-models/llama-fp16 --device gpu
#        --settings "ORT_MLX_GROUPED_KV=1;ORT_MLX_GROUPED_KV=0" --context 1024
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ -f .gpu/p2/install.sh ] || { echo "run ../shared/tools/gpu-prep first" >&2; exit 1; }
data=.deps/libonnx-testdata/usr/share/libonnx-testdata/data
mkdir -p .gpu/td .gpu/wheels
tar cf - -C "$data" node | xz -T2 -6 > .gpu/td/node.tar.xz
pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .gpu/wheels)
"${pip[@]}" --platform manylinux_2_28_x86_64 onnxruntime-genai
"${pip[@]}" onnx-ir "mlx-lm==0.32.*"
du -sh .gpu/p1 .gpu/p2 .gpu/td .gpu/wheels
