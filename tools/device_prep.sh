#!/usr/bin/env bash
# Prepares what the GPU suite needs on a device machine that has no network and takes at most
# 64 MiB a call (the H200 of the development sessions), after ../shared/tools/gpu-prep made
# .gpu/p1 .. .gpu/pN (MLX's CUDA wheels and onnxruntime-gpu, in 48 MiB parts):
#   .gpu/td/node.tar.xz  the ONNX node tests for the conformance runner (49 MB -> ~2 MB)
#   .gpu/wheels/         onnxruntime-genai (the model builder), onnx-ir and mlx-lm for
#                        Python 3.12, from PyPI, for scripts/gpu-bench
# Run from the project root after scripts/setup. Then, calls back to back (the machine keeps
# /tmp only while it stays warm, ~30 s after a call):
#   1 .. N-1. carry [.gpu/pk]:  cp .gpu/pk/part /tmp/gpu.part.k
#   N. carry [.gpu/pN, .gpu/td, .gpu/wheels, .deps/libonnxruntime-dev]:
#      source .gpu/pN/install.sh && mkdir -p /tmp/td && xz -dc .gpu/td/node.tar.xz | tar x -C /tmp/td &&
#      GPU_TEST_PARTS=build scripts/gpu-test $OUT && scripts/gpu-bench $OUT/bench
#      (install.sh unpacks MLX into /tmp/site and onnxruntime-gpu into /tmp/ortgpu and writes
#      /tmp/gpu-env.sh: PYTHONPATH with onnxruntime-gpu first, MLX_CMAKE_DIR. Add to PYTHONPATH,
#      never replace it.)
#   later calls, same carry but the part: source /tmp/gpu-env.sh && ...
# scripts/gpu-bench generates the models it misses (genai's -e cuda and -e cpu forms of a 0.44B
# Llama, fp16 and int4, ~30 s each) and runs the EP against ORT's CUDA EP, mlx-lm and PyTorch.
# The conformance run on the GPU device:
#      GPU_TEST_PARTS=conformance GPU_TEST_DEVICES=gpu CONFORMANCE_JOBS=16 CONFORMANCE_LIMIT=480 \
#        CONFORMANCE_DATA=/tmp/td/node scripts/gpu-test $OUT
# and the oracle in four shards: GPU_TEST_PARTS=pytest GPU_TEST_SHARD=k/4 scripts/gpu-test $OUT.
# A/Bs of one change in one process (tools/decode_steps.py), e.g. the shared KV buffer against
# the growing cache, and ORT's CUDA EP on the same file:
#      PYTHONPATH=python:$PYTHONPATH python3 tools/decode_steps.py /tmp/gpu-models/llama_cuda-fp16 --device gpu
#        --settings "share_buffer=1;share_buffer=0;provider=cuda,share_buffer=1" --context 1024
# A machine start costs ~90 s of device time: keep ~150 s for the last call.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
ls .gpu/p*/install.sh >/dev/null 2>&1 || { echo "run ../shared/tools/gpu-prep first" >&2; exit 1; }
data=.deps/libonnx-testdata/usr/share/libonnx-testdata/data
mkdir -p .gpu/td .gpu/wheels
tar cf - -C "$data" node | xz -T2 -6 > .gpu/td/node.tar.xz
pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .gpu/wheels)
"${pip[@]}" --platform manylinux_2_28_x86_64 onnxruntime-genai
"${pip[@]}" onnx-ir "mlx-lm==0.32.*"
du -sh .gpu/p* .gpu/td .gpu/wheels
