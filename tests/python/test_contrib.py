"""com.microsoft transformer ops (and ai.onnx Attention/RotaryEmbedding) against ORT's CPU EP,
which implements every one of them, with the node forced onto MLX (no CPU fallback)."""
import json
import os

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import oracle
from oracle import check_node, make_node_model, run_cpu, run_mlx, assert_close

import onnxruntime_mlx as om

rng = np.random.default_rng(0)
MS = "com.microsoft"


def float_type(inputs, initializers):
    for a in list(inputs.values()) + list((initializers or {}).values()):
        if a is not None and (a.dtype.kind == "f" or str(a.dtype) == "bfloat16"):
            return a.dtype
    return np.dtype(np.float32)


def check_tol(op, inputs, attrs=None, *, initializers=None, outputs=1, rtol=1e-4, atol=1e-5,
              opset=oracle.DEFAULT_OPSET, domain=MS, input_order=None, rows=None,
              output_types=None, expected=None, **options):
    """Like check_node, with an explicit tolerance (quantized and attention ops accumulate in
    another order than ORT). `rows` optionally restricts output 0 to a row mask. ONNX's shape
    inference does not know com.microsoft ops: outputs default to the first float input's type."""
    n_out = outputs if isinstance(outputs, int) else len(outputs)
    types = output_types or [oracle.tensor_type(np.zeros(0, float_type(inputs, initializers)))] * n_out
    model = make_node_model(op, inputs, outputs, attrs, initializers, opset, domain,
                            output_types=types, input_order=input_order)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    ref = expected if expected is not None else run_cpu(model, feeds)
    outs, placed = run_mlx(model, feeds, **options)
    assert set(placed) == {om.EP_NAME} and len(placed[om.EP_NAME]) == 1, placed
    for i, (a, e) in enumerate(zip(outs, ref)):
        assert a.shape == e.shape and a.dtype == e.dtype, (i, a.shape, e.shape, a.dtype, e.dtype)
        if i == 0 and rows is not None:
            a, e = a[rows], e[rows]
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=f"output {i}")
    return outs


# ---- MatMulNBits ---------------------------------------------------------------------------

def pack_bits(vals, bits):
    """Packs unsigned `bits`-wide values along the last axis, low-order bits first (ORT layout)."""
    per = 8 // bits
    pad = (-vals.shape[-1]) % per
    v = np.concatenate([vals, np.zeros(vals.shape[:-1] + (pad,), vals.dtype)], -1) if pad else vals
    v = v.reshape(v.shape[:-1] + (-1, per)).astype(np.uint16)
    out = np.zeros(v.shape[:-1], np.uint16)
    for i in range(per):
        out |= v[..., i] << (i * bits)
    return out.astype(np.uint8)


def nbits_weights(K, N, bits, block, zp_kind, dtype=np.float32, want_ref=False):
    nb = (K + block - 1) // block
    q = rng.integers(0, 2 ** bits, size=(N, nb, block))
    B = pack_bits(q, bits)                                   # [N, nb, blob]
    scales = rng.uniform(0.005, 0.05, size=(N * nb,)).astype(dtype)
    zp, zpf = None, np.full((N, nb), 2.0 ** (bits - 1))
    if zp_kind == "u8":
        zpv = rng.integers(0, 2 ** bits, size=(N, nb))
        zp, zpf = pack_bits(zpv, bits), zpv.astype(np.float64)
    elif zp_kind == "float":
        zp = rng.uniform(0, 2 ** bits - 1, size=(N * nb,)).astype(dtype)
        zpf = zp.reshape(N, nb).astype(np.float64)
    # numpy reference of the dequantized weight [N, K]: (q - zp) * scale
    w = ((q - zpf[..., None]) * scales.reshape(N, nb, 1).astype(np.float64)).reshape(N, -1)[:, :K]
    return (B, scales, zp, w) if want_ref else (B, scales, zp)


def nbits_check(M, K, N, bits, block, zp_kind=None, dtype=np.float32, bias=False, a_shape=None,
                g_idx=None, b_as_input=False, accuracy_level=0, rtol=1e-3, atol=1e-4, **options):
    B, scales, zp = nbits_weights(K, N, bits, block, zp_kind, dtype)
    a = rng.standard_normal(a_shape or (M, K)).astype(dtype)
    inits = {"B": B, "scales": scales, "zp": zp, "g_idx": g_idx,
             "bias": rng.standard_normal(N).astype(dtype) if bias else None}
    inputs = {"A": a}
    if b_as_input:
        inputs["B"] = inits.pop("B")
    check_tol("MatMulNBits", inputs, {"K": K, "N": N, "bits": bits, "block_size": block,
                                      "accuracy_level": accuracy_level},
              initializers=inits, input_order=["A", "B", "scales", "zp", "g_idx", "bias"],
              rtol=rtol, atol=atol, **options)


# A prompt's rows: on the GPU, int4_dense_rows=128 dequantizes the weight and runs a dense product
# (MLX's quantized matmul is several times slower there for many rows), 0 keeps the quantized
# matmul for fp16 (float32 rows always take the dense form: MLX's float32 kernel fails to launch
# at block 128 for many rows); all equal ORT's CPU EP. On the CPU device the option changes nothing.
@pytest.mark.parametrize("dense_rows", [128, 0])
@pytest.mark.parametrize("block", [32, 64, 128])
@pytest.mark.parametrize("zp_kind", [None, "u8", "float"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matmul_nbits_many_rows(dense_rows, block, zp_kind, dtype):
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == np.float16 else {}
    nbits_check(160, 2 * block, 48, 4, block, zp_kind, dtype=dtype, bias=True, int4_dense_rows=dense_rows, **tol)


@pytest.mark.skipif(oracle.DEVICE != "gpu", reason="the dense path is the GPU's")
def test_matmul_nbits_many_rows_dequantizes_on_the_gpu(tmp_path):
    """The path int4_dense_rows picks is the one that runs: with 160 rows, the dense form
    evaluates one array more a run (the dequantized weight) than MLX's quantized matmul, and
    with 8 rows (under the threshold) both settings evaluate the same."""
    B, scales, zp = nbits_weights(128, 48, 4, 64, "u8", np.float16)
    arrays = {}
    for rows in (160, 8):
        for dense in (128, 0):
            a = rng.standard_normal((rows, 128)).astype(np.float16)
            model = make_node_model("MatMulNBits", {"A": a}, 1, {"K": 128, "N": 48, "bits": 4, "block_size": 64},
                                    {"B": B, "scales": scales, "zp": zp}, domain=MS,
                                    output_types=[oracle.tensor_type(np.zeros(0, np.float16))],
                                    input_order=["A", "B", "scales", "zp"])
            report = tmp_path / f"r{rows}_{dense}.jsonl"
            s = om.InferenceSession(model.SerializeToString(), "gpu", fallback=False, report_path=str(report),
                                    int4_dense_rows=dense)
            for _ in range(3):
                s.run(None, {"A": a})
            del s
            line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
            arrays[rows, dense] = line["eval_arrays"] / line["runs"]
    assert arrays[160, 128] > arrays[160, 0], arrays
    assert arrays[8, 128] == arrays[8, 0], arrays


@pytest.mark.skipif(oracle.DEVICE != "gpu", reason="the dequantization kernel exists on MLX's CUDA backend only")
@pytest.mark.parametrize("zp_kind", [None, "u8", "float"])
@pytest.mark.parametrize("block", [32, 128, 256])
def test_matmul_nbits_dequantize_kernel_on_the_gpu(zp_kind, block, tmp_path):
    """A prompt's 4-bit product dequantizes its weight with the EP's kernel
    (int4_dequantize_kernel=1, kernels/cuda/dequantize.h), not MLX's: outputs equal ORT's CPU EP
    with either dequantization (=0: MLX's), and the report counts the kernel's nodes only with it on.
    Broken by a kernel that takes the nibbles in the wrong order, the wrong group's scale or bias,
    or by the product not taking it."""
    import gc
    counts = {}
    for kernel in (1, 0):
        report = tmp_path / f"r{kernel}.jsonl"
        nbits_check(160, 2 * block, 48, 4, block, zp_kind, dtype=np.float16, bias=True, rtol=2e-2, atol=2e-2,
                    int4_dequantize_kernel=kernel, report_path=str(report))
        gc.collect()
        line = next(json.loads(ln) for ln in report.read_text().splitlines() if '"fused_node"' in ln)
        counts[kernel] = line["process_dequantize_int4_nodes"]
    assert counts[1] > 0 and counts[0] == counts[1], counts


# fp32 MatMulNBits: MLX sums in another order than MLAS (and computes q*scale - zp*scale rather
# than (q - zp)*scale), so results agree to ~1e-6 relative; rtol 1e-3 / atol 1e-4 leaves margin.
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("zp_kind", [None, "u8", "float"])
@pytest.mark.parametrize("M", [1, 5, 9])  # the CPU backend dequantizes for 8+ rows
def test_matmul_nbits(bits, block, zp_kind, M):
    if bits == 8 and zp_kind == "float":
        pytest.skip("ORT's CPU EP has no 8-bit kernel with float zero points: see the numpy test")
    nbits_check(M, 2 * block, 24, bits, block, zp_kind)


# One row on the CPU runs the EP's 4-bit row kernel (kernels/cpu/int4_gemv.cc): a partial last block
# (K not a multiple of block_size), enough rows to split over threads, 3-D A, accuracy level 4,
# weights as a graph input, and a bias.
@pytest.mark.parametrize("block", [16, 32, 128])
@pytest.mark.parametrize("zp_kind", [None, "u8", "float"])
@pytest.mark.parametrize("case", ["partial", "threads", "3d", "acc4", "b_input", "bias"])
def test_matmul_nbits_one_row(block, zp_kind, case):
    K, N = (1000, 600) if case == "threads" else (3 * block + 5, 40)
    kw = {"partial": {}, "threads": {}, "3d": {"a_shape": (1, 1, K)}, "acc4": {"accuracy_level": 4},
          "b_input": {"b_as_input": True}, "bias": {"bias": True}}[case]
    if case == "acc4" and zp_kind == "float":
        pytest.skip("accuracy_level 4 with float zero points: ORT's kernel differs (see above)")
    nbits_check(1, K, N, 4, block, zp_kind, **kw)


@pytest.mark.parametrize("block", [16, 32, 256])
def test_matmul_nbits_8bit_float_zero_points(block):
    # The oracle cannot run this case ("Only 2b and 4b quantization is supported for unpacked
    # compute"): compare with (q - zp) * scale in numpy.
    K, N = 2 * block, 24
    B, scales, zp, w = nbits_weights(K, N, 8, block, "float", want_ref=True)
    a = rng.standard_normal((5, K)).astype(np.float32)
    check_tol("MatMulNBits", {"A": a}, {"K": K, "N": N, "bits": 8, "block_size": block},
              initializers={"B": B, "scales": scales, "zp": zp}, rtol=1e-4, atol=1e-4,
              expected=[(a.astype(np.float64) @ w.T).astype(np.float32)])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32, 128])
def test_matmul_nbits_k_padding(bits, block):
    # K not a multiple of the block: the last block is padded in B.
    nbits_check(3, block + 24, 16, bits, block, "u8")


def test_matmul_nbits_bias_and_batched_a():
    nbits_check(None, 96, 40, 4, 32, "u8", bias=True, a_shape=(2, 3, 96))


def test_matmul_nbits_runtime_weights():
    nbits_check(4, 64, 16, 4, 32, "u8", b_as_input=True)


@pytest.mark.parametrize("block", [32, 16])
def test_matmul_nbits_fp16(block):
    # fp16 in and out: ORT rounds the product to fp16, as do we (computed in float32).
    nbits_check(5, 128, 32, 4, block, "u8", dtype=np.float16, bias=True, rtol=2e-2, atol=2e-2)


def test_matmul_nbits_g_idx():
    K, block = 96, 32
    g = rng.permutation(np.arange(K) // block).astype(np.int32)
    nbits_check(3, K, 16, 4, block, "float", g_idx=g)
    nbits_check(3, K, 16, 4, block, None, g_idx=g)
    # the identity map takes the quantized_matmul path
    nbits_check(3, K, 16, 4, block, None, g_idx=(np.arange(K) // block).astype(np.int32))


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block", [16, 32, 128])
@pytest.mark.parametrize("zp_kind", [None, "u8", "float"])
@pytest.mark.parametrize("M", [1, 5, 9])
def test_matmul_nbits_accuracy_level_4(bits, block, zp_kind, M):
    # Level 4: ORT's CPU EP quantizes A to int8 per block (not with float zero points); we do the
    # same, so the results agree to float rounding (plain float A would differ by ~1%).
    if bits == 8 and zp_kind == "float":
        pytest.skip("ORT's CPU EP has no 8-bit kernel with float zero points")
    nbits_check(M, 2 * block + 8, 24, bits, block, zp_kind, accuracy_level=4)


@pytest.mark.parametrize("M", [1, 9])  # the 4-bit row kernel, and the graph path
def test_matmul_nbits_accuracy_level_4_rounding_ties(M):
    # Blocks whose maximum and one value put x * (127 / max) and x * (1 / (max / 127)) on
    # different sides of a rounding tie: MLAS (ORT's CPU EP) codes with 127 / max.
    K, N, block = 64, 16, 32
    B, scales, zp = nbits_weights(K, N, 4, block, None)
    a = rng.uniform(-0.3, 0.3, (M, K)).astype(np.float32)
    for row in range(M):
        for b0, (amax, x) in zip((0, 32), [(2.4026875495910645, 1.087830901145935),
                                           (1.1147947311401367, -0.9085137844085693)]):
            a[row, b0], a[row, b0 + 5] = amax, x
    check_tol("MatMulNBits", {"A": a}, {"K": K, "N": N, "bits": 4, "block_size": block,
                                        "accuracy_level": 4},
              initializers={"B": B, "scales": scales}, input_order=["A", "B", "scales"],
              rtol=1e-5, atol=1e-5)


def test_matmul_nbits_accuracy_level_4_half():
    nbits_check(3, 64, 24, 4, 32, "u8", dtype=np.float16, accuracy_level=4, rtol=2e-2, atol=2e-2)


def test_matmul_nbits_declines_g_idx_with_packed_zero_points():
    K, block = 64, 32
    B, scales, zp = nbits_weights(K, 8, 4, block, "u8")
    m = make_node_model("MatMulNBits", {"A": rng.standard_normal((2, K)).astype(np.float32)},
                        1, {"K": K, "N": 8, "bits": 4, "block_size": block},
                        {"B": B, "scales": scales, "zp": zp,
                         "g": (np.arange(K) // block).astype(np.int32)}, domain=MS,
                        output_types=[1])
    placed = oracle.placement_of(m, {"A": rng.standard_normal((2, K)).astype(np.float32)})
    assert om.EP_NAME not in placed


# ---- GatherBlockQuantized ------------------------------------------------------------------

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zp", [False, True])
def test_gather_block_quantized(bits, zp):
    rows, D, block = 10, 64, 32
    q = rng.integers(0, 2 ** bits, size=(rows, D))
    data = pack_bits(q, bits)
    scales = rng.uniform(0.01, 0.1, size=(rows, D // block)).astype(np.float32)
    zps = pack_bits(rng.integers(0, 2 ** bits, size=(rows, D // block)), bits) if zp else None
    idx = np.array([[0, 3, 9], [2, -1, 5]], np.int64)
    check_tol("GatherBlockQuantized", {"idx": idx},
              {"bits": bits, "block_size": block, "gather_axis": 0, "quantize_axis": 1},
              initializers={"data": data, "scales": scales, "zp": zps},
              input_order=["data", "idx", "scales", "zp"])


# ---- GroupQueryAttention -------------------------------------------------------------------

def rope_cache(max_seq, rot_dim, dtype=np.float32, base=10000.0):
    inv = 1.0 / base ** (np.arange(0, rot_dim, 2) / rot_dim)
    ang = np.outer(np.arange(max_seq), inv)
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def gqa_check(B=2, S=4, N=4, Nkv=2, H=16, past=None, seqlens=None, total=None, packed=False,
              rotary=False, interleaved=False, rot_dim=None, window=-1, softcap=0.0, smooth=0,
              dtype=np.float32, bias=False, sink=False, position_ids=None, scale=None,
              rtol=1e-4, atol=1e-5, rows=None, **options):
    """past: None (no past inputs) or the past buffer length P. seqlens: total_b - 1 per batch.
    options: the EP's session options."""
    f = lambda *shape: rng.standard_normal(shape).astype(dtype)
    if seqlens is None:
        seqlens = [S - 1] * B if not past else [past + S - 1] * B
    seqlens = np.array(seqlens, np.int32)
    total = int(seqlens.max()) + 1 if total is None else total
    inputs = {}
    if packed:
        inputs.update(query=f(B, S, (N + 2 * Nkv) * H), key=None, value=None)
    else:
        inputs.update(query=f(B, S, N * H), key=f(B, S, Nkv * H), value=f(B, S, Nkv * H))
    if past is not None:
        inputs.update(past_key=f(B, Nkv, past, H), past_value=f(B, Nkv, past, H))
    else:
        inputs.update(past_key=None, past_value=None)
    inputs.update(seqlens_k=seqlens, total_sequence_length=np.array(total, np.int32))
    if rotary:
        cos, sin = rope_cache(max(total, past or 0) + 4, rot_dim or H, dtype)
        inputs.update(cos_cache=cos, sin_cache=sin)
    else:
        inputs.update(cos_cache=None, sin_cache=None)
    inputs["position_ids"] = position_ids
    inputs["attention_bias"] = f(B, N, S, total) if bias else None
    inputs["head_sink"] = f(N) if sink else None
    attrs = {"num_heads": N, "kv_num_heads": Nkv, "do_rotary": int(rotary),
             "rotary_interleaved": int(interleaved), "local_window_size": window,
             "softcap": softcap, "smooth_softmax": smooth}
    if scale is not None:
        attrs["scale"] = scale
    t = oracle.tensor_type(np.zeros(0, dtype))
    return check_tol("GroupQueryAttention", inputs, attrs, outputs=3, output_types=[t] * 3,
                     rtol=rtol, atol=atol, rows=rows, **options)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("rotary,interleaved", [(False, False), (True, False), (True, True)])
def test_gqa_prompt(packed, rotary, interleaved):
    gqa_check(B=2, S=5, packed=packed, rotary=rotary, interleaved=interleaved)


@pytest.mark.parametrize("rotary,interleaved", [(False, False), (True, False), (True, True)])
def test_gqa_prompt_empty_past(rotary, interleaved):
    # genai's first step feeds past_key/past_value with 0 rows
    gqa_check(B=1, S=6, past=0, rotary=rotary, interleaved=interleaved)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("rotary,interleaved", [(False, False), (True, False), (True, True)])
def test_gqa_token_ragged_batch(packed, rotary, interleaved):
    # batch 2 with different histories: entry 0 has 3 past rows, entry 1 has 7 (P = 7)
    gqa_check(B=2, S=1, past=7, seqlens=[3, 7], packed=packed, rotary=rotary,
              interleaved=interleaved)


@pytest.mark.parametrize("rotary", [False, True])
def test_gqa_token_shared_buffer(rotary):
    # past buffer of max length 12, present keeps that length; new rows land at seqlens_k
    gqa_check(B=2, S=1, past=12, seqlens=[4, 9], rotary=rotary)
    # the prompt into the same buffer: rows 0..S-1, zeros after
    gqa_check(B=2, S=5, past=12, seqlens=[4, 4], total=5, rotary=rotary)


@pytest.mark.parametrize("window", [-1, 3])
@pytest.mark.parametrize("packed", [False, True])
def test_gqa_token_shared_buffer_grouped_heads(window, packed):
    # The decode step the GPU's one-row kernel takes (kernels/cuda/decode_attention): grouped
    # heads, a window, a first step at row 0, head sizes on and off its 16-byte loads.
    gqa_check(B=2, S=1, N=8, Nkv=2, H=64, past=40, seqlens=[17, 39], window=window, packed=packed,
              rotary=True)
    # (Batches of two: with one sequence ORT leaves the present rows past it unwritten, see
    # test_gqa_batch1_decode; the LLM tests cover that case.)
    gqa_check(B=2, S=1, N=4, Nkv=4, H=24, past=16, seqlens=[0, 11], window=window, packed=packed)
    gqa_check(B=2, S=1, N=4, Nkv=1, H=32, past=24, seqlens=[9, 3], window=window, packed=packed,
              dtype=np.float16, rtol=1e-2, atol=1e-2)
    # The rotation the projections kernel applies itself (kernels/cuda decode_attention_qkv):
    # interleaved pairs and a partial rotary width.
    gqa_check(B=2, S=1, N=8, Nkv=2, H=64, past=40, seqlens=[17, 39], window=window, packed=packed,
              rotary=True, interleaved=True)
    gqa_check(B=2, S=1, N=8, Nkv=2, H=64, past=40, seqlens=[5, 30], window=window, packed=packed,
              rotary=True, rot_dim=32)


@pytest.mark.skipif(oracle.DEVICE != "gpu", reason="the split attention exists on MLX's CUDA backend only")
@pytest.mark.parametrize("fused_step", [1, 0])
@pytest.mark.parametrize("packed", [False, True])
def test_gqa_decode_attention_splits_on_gpu(fused_step, packed, tmp_path):
    """A decode step's attention over a long shared buffer takes its rows in splits of
    gpu_attention_split_rows, one block each, and a second kernel combines them: with splits of
    16 rows (some wholly past a sequence's length, some before its window, one holding the step's
    own row) the outputs equal ORT's CPU EP, as with one block a head (0), in the projections
    kernel (fused_gqa_step=1) and the one-row kernel (0); the report counts split launches only
    where splits were asked for. Broken by a split that drops or repeats rows, a combination that
    rescales wrongly, or the split form not being taken."""
    import gc
    import json

    def split_nodes(report):
        gc.collect()
        line = next(json.loads(x) for x in report.read_text().splitlines() if '"fused_node"' in x)
        return line["process_decode_attention_split_nodes"]

    for window in (-1, 37):
        counts = {}
        for split in (16, 0):
            report = tmp_path / f"r{split}_{window}.jsonl"
            gqa_check(B=2, S=1, N=8, Nkv=2, H=64, past=300, seqlens=[130, 299], window=window, packed=packed,
                      rotary=True, dtype=np.float16, rtol=1e-2, atol=1e-2, gpu_attention_split_rows=split,
                      fused_gqa_step=fused_step, report_path=str(report))
            counts[split] = split_nodes(report)
        # (process counters: the second session adds none when it asks for no splits)
        assert counts[16] > 0 and counts[0] == counts[16], counts


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("rotary,interleaved", [(False, False), (True, False), (True, True)])
def test_gqa_batch1_decode(packed, rotary, interleaved):
    # One sequence (a generate loop): its length is read on the host, the unpadded step runs
    # without a mask and builds present by concatenation. (A shared buffer longer than the
    # sequence takes the masked path; its present rows past the sequence are unspecified in ORT
    # and differ, see gqa_present, so it is not compared here.)
    gqa_check(B=1, S=1, past=7, seqlens=[7], packed=packed, rotary=rotary, interleaved=interleaved)
    gqa_check(B=1, S=5, packed=packed, rotary=rotary, interleaved=interleaved)  # causal prompt


def test_gqa_subsequent_prompt():
    # S > 1 with past context (chunked prefill / continued prompt): batch 1
    gqa_check(B=1, S=3, past=5, seqlens=[7], rotary=True)


@pytest.mark.parametrize("window", [1, 3])
def test_gqa_local_window(window):
    gqa_check(B=1, S=6, window=window, rotary=True)
    gqa_check(B=2, S=1, past=8, seqlens=[5, 8], window=window)


def test_gqa_softcap_smooth_scale():
    gqa_check(B=2, S=5, softcap=2.0)
    gqa_check(B=2, S=5, smooth=1)
    gqa_check(B=2, S=1, past=4, seqlens=[2, 4], softcap=1.5, smooth=1, scale=0.3)


def test_gqa_partial_rotary_and_heads():
    gqa_check(B=1, S=4, N=8, Nkv=1, H=32, rotary=True, rot_dim=16)
    gqa_check(B=1, S=4, N=6, Nkv=6, H=16, rotary=True, interleaved=True)


def test_gqa_bias_and_sink():
    gqa_check(B=2, S=4, bias=True)
    gqa_check(B=2, S=4, sink=True)
    gqa_check(B=1, S=1, past=6, seqlens=[6], sink=True, bias=True, softcap=3.0)


def test_gqa_position_ids():
    pos = np.array([[3, 4, 5, 6]], np.int64)
    gqa_check(B=1, S=4, rotary=True, position_ids=pos)


@pytest.mark.parametrize("dtype", [np.float16])
def test_gqa_half(dtype):
    gqa_check(B=2, S=5, rotary=True, dtype=dtype, rtol=2e-2, atol=2e-3)
    gqa_check(B=2, S=1, past=6, seqlens=[2, 6], rotary=True, dtype=dtype, rtol=2e-2, atol=2e-3)


def test_gqa_right_padded_prompt():
    # Entry 1 has 3 real tokens of 5: ORT leaves its padding rows unspecified; compare the rest.
    rows = np.ones((2, 5), bool)
    rows[1, 3:] = False
    gqa_check(B=2, S=5, seqlens=[4, 2], rotary=True, rows=rows)


# ---- RotaryEmbedding -----------------------------------------------------------------------

@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["bsd", "bnsh"])
@pytest.mark.parametrize("pos_kind", ["2d", "scalar"])
def test_rotary_ms(interleaved, layout, pos_kind):
    B, S, N, H = 2, 5, 3, 16
    x = rng.standard_normal((B, S, N * H) if layout == "bsd" else (B, N, S, H)).astype(np.float32)
    cos, sin = rope_cache(32, H)
    pos = (rng.integers(0, 27, size=(B, S)).astype(np.int64) if pos_kind == "2d"
           else np.array([4], np.int64))
    attrs = {"interleaved": interleaved}
    if layout == "bsd":
        attrs["num_heads"] = N
    check_tol("RotaryEmbedding", {"x": x, "pos": pos}, attrs, initializers={"cos": cos, "sin": sin},
              input_order=["x", "pos", "cos", "sin"])


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_ms_partial_and_half(interleaved):
    B, S, N, H, rd = 1, 4, 2, 32, 16
    x = rng.standard_normal((B, S, N * H)).astype(np.float32)
    cos, sin = rope_cache(16, rd)
    pos = np.array([[0, 1, 2, 3]], np.int64)
    check_tol("RotaryEmbedding", {"x": x, "pos": pos, "cos": cos, "sin": sin},
              {"interleaved": interleaved, "num_heads": N, "rotary_embedding_dim": rd})
    # num_heads inferred from the cache (full rotation)
    check_tol("RotaryEmbedding", {"x": x, "pos": pos, "cos": rope_cache(16, H)[0],
                                  "sin": rope_cache(16, H)[1]}, {"interleaved": interleaved})
    xh = x.astype(np.float16)
    ch, sh = (a.astype(np.float16) for a in rope_cache(16, H))
    check_tol("RotaryEmbedding", {"x": xh, "pos": pos, "cos": ch, "sin": sh},
              {"interleaved": interleaved, "num_heads": N}, rtol=1e-2, atol=2e-3)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("with_pos", [True, False])
@pytest.mark.parametrize("layout", ["bsd", "bnsh"])
def test_rotary_onnx23(interleaved, with_pos, layout):
    B, S, N, H = 2, 4, 2, 8
    x = rng.standard_normal((B, S, N * H) if layout == "bsd" else (B, N, S, H)).astype(np.float32)
    attrs = {"interleaved": interleaved}
    if layout == "bsd":
        attrs["num_heads"] = N
    if with_pos:
        cos, sin = rope_cache(12, H)
        pos = rng.integers(0, 12, size=(B, S)).astype(np.int64)
    else:
        ang = rng.uniform(0, 3, size=(B, S, H // 2))
        cos, sin, pos = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32), None
    check_tol("RotaryEmbedding", {"x": x, "cos": cos, "sin": sin, "pos": pos}, attrs, opset=23,
              domain="")
    if layout == "bsd" and with_pos:  # partial rotation
        cos, sin = rope_cache(12, H // 2)
        check_tol("RotaryEmbedding", {"x": x, "cos": cos, "sin": sin, "pos": pos},
                  dict(attrs, rotary_embedding_dim=H // 2), opset=23, domain="")


@pytest.mark.parametrize("domain", ["com.microsoft", ""])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("rd", [8, 16])
def test_rotary_constant_caches_partial(domain, dtype, rd):
    # Constant caches: the halves form's tables are prepared once and shared between nodes
    # (ops/contrib/rotary.cc, shared_half_tables); two nodes here read the same caches (Q and K).
    B, S, N, H = 2, 3, 2, 16
    cos, sin = (a.astype(dtype) for a in rope_cache(10, rd))
    pos = rng.integers(0, 10, size=(B, S)).astype(np.int64)
    q, k = (rng.standard_normal((B, S, N * H)).astype(dtype) for _ in range(2))
    attrs = {"num_heads": N, "rotary_embedding_dim": rd}
    ins = {"ms": lambda x, y: [x, "pos", "cos", "sin"], "": lambda x, y: [x, "cos", "sin", "pos"]}
    order = ins["ms" if domain else ""]
    nodes = [helper.make_node("RotaryEmbedding", order(x, y), [y], domain=domain, **attrs)
             for x, y in (("q", "q_rot"), ("k", "k_rot"))]
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    g = helper.make_graph(nodes, "rope", [helper.make_tensor_value_info("q", t, None),
                                          helper.make_tensor_value_info("k", t, None),
                                          helper.make_tensor_value_info("pos", TensorProto.INT64, None)],
                          [helper.make_tensor_value_info(n, t, None) for n in ("q_rot", "k_rot")],
                          [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")])
    opsets = [helper.make_opsetid("", 23)] + ([helper.make_opsetid("com.microsoft", 1)] if domain else [])
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 10
    feeds = {"q": q, "k": k, "pos": pos}
    want = oracle.run_cpu(m, feeds)
    got, placement = oracle.run_mlx(m, feeds)
    assert len(placement.get(om.EP_NAME, [])) == 2, placement
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32),
                                   rtol=1e-2 if dtype == np.float16 else 1e-5,
                                   atol=2e-3 if dtype == np.float16 else 1e-5)


# ---- normalizations ------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("skip_shape", ["full", "broadcast", "2d"])
def test_skip_layer_norm(op, bias, skip_shape):
    B, S, D = 2, 3, 32
    x = rng.standard_normal((B, S, D)).astype(np.float32)
    skip = rng.standard_normal({"full": (B, S, D), "broadcast": (1, S, D), "2d": (S, D)}[skip_shape]
                               ).astype(np.float32)
    g = rng.standard_normal(D).astype(np.float32)
    simplified = op.startswith("SkipSimplified")
    ins = {"x": x, "skip": skip, "gamma": g}
    if not simplified:
        ins["beta"] = rng.standard_normal(D).astype(np.float32)
    ins["bias"] = rng.standard_normal(D).astype(np.float32) if bias else None
    t = oracle.tensor_type(x)
    check_tol(op, ins, {"epsilon": 1e-5}, outputs=4, output_types=[t, 1, 1, t], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_skip_layer_norm_half_and_unused_outputs(op):
    from onnx import helper
    B, S, D = 2, 3, 64
    feeds = {"x": rng.standard_normal((B, S, D)).astype(np.float16),
             "skip": rng.standard_normal((B, S, D)).astype(np.float16),
             "gamma": rng.standard_normal(D).astype(np.float16)}
    check_tol(op, feeds, outputs=1, rtol=1e-2, atol=1e-2)
    # only the output and the sum (the genai layout: mean and inv_std_var unused)
    node = helper.make_node(op, ["x", "skip", "gamma"], ["y", "", "", "sum"], domain=MS)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, 10, list(a.shape))
                                            for n, a in feeds.items()],
                              [helper.make_tensor_value_info(n, 10, None) for n in ("y", "sum")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    ref = run_cpu(m, feeds)
    outs, placed = run_mlx(m, feeds)
    assert set(placed) == {om.EP_NAME}
    for a, e in zip(outs, ref):
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(oracle.DEVICE != "gpu", reason="the fused kernel exists on MLX's CUDA backend only")
@pytest.mark.parametrize("dtype,bias", [(np.float16, False), (np.float32, True)])
def test_skip_simplified_layer_norm_cuda_kernel(dtype, bias, tmp_path):
    """On a CUDA GPU, SkipSimplifiedLayerNormalization's add and RMS normalization run as the
    EP's one kernel (kernels/cuda/skip_rms_norm): the report counts its graph nodes, and both
    outputs equal MLX's own ops (gpu_kernels=0) and ORT's CPU EP. Broken by a kernel that drops
    the bias, rounds the sum otherwise, or a translator that no longer takes it."""
    import json
    from onnx import helper
    B, S, D = 2, 5, 1000  # D not a multiple of the block's threads
    feeds = {"x": rng.standard_normal((B, S, D)).astype(dtype),
             "skip": rng.standard_normal((B, S, D)).astype(dtype),
             "gamma": rng.standard_normal(D).astype(dtype)}
    if bias:
        feeds["bias"] = rng.standard_normal(D).astype(dtype)
    t = oracle.tensor_type(feeds["x"])
    node = helper.make_node("SkipSimplifiedLayerNormalization", list(feeds), ["y", "", "", "sum"],
                            domain=MS, epsilon=1e-6)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, list(a.shape))
                                            for n, a in feeds.items()],
                              [helper.make_tensor_value_info(n, t, None) for n in ("y", "sum")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    m.ir_version = 10

    def run(kernels):
        report = tmp_path / f"r{kernels}.jsonl"
        outs, placed = run_mlx(m, feeds, gpu_kernels=kernels, report_path=str(report))
        assert set(placed) == {om.EP_NAME}
        import gc
        gc.collect()
        line = next(json.loads(x) for x in report.read_text().splitlines() if '"fused_node"' in x)
        return outs, line["process_skip_rms_norm_nodes"]

    off, nodes_off = run(0)
    on, nodes_on = run(1)
    assert nodes_on > nodes_off, "the node did not take the kernel"
    tol = 1e-2 if dtype == np.float16 else 1e-5
    for a, b, r in zip(on, off, run_cpu(m, feeds)):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=tol, atol=tol)
        np.testing.assert_allclose(a.astype(np.float32), r.astype(np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("domain", ["", MS])
@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm(domain, axis):
    if domain == MS:
        pytest.skip("ORT has no com.microsoft SimplifiedLayerNormalization schema to load a model with")
    x = rng.standard_normal((2, 3, 16)).astype(np.float32)
    g = rng.standard_normal((16,) if axis == -1 else (3, 16)).astype(np.float32)
    check_tol("SimplifiedLayerNormalization", {"x": x, "g": g}, {"axis": axis, "epsilon": 1e-6},
              outputs=2, output_types=[1, 1], domain=domain)


def test_simplified_layer_norm_mixed_types():
    x = rng.standard_normal((2, 3, 16)).astype(np.float32)
    g = rng.standard_normal(16).astype(np.float16)
    check_tol("SimplifiedLayerNormalization", {"x": x, "g": g}, outputs=2, output_types=[10, 1],
              domain="", rtol=1e-2, atol=1e-2)
    xh = x.astype(np.float16)
    check_tol("SimplifiedLayerNormalization", {"x": xh, "g": g}, outputs=1, output_types=[10],
              domain="", rtol=1e-2, atol=1e-2)
    # float64 (inv_std_var stays float32 with the default stash_type)
    check_tol("SimplifiedLayerNormalization", {"x": x.astype(np.float64), "g": g.astype(np.float64)},
              outputs=2, output_types=[11, 1], domain="", rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("segments", [False, True])
@pytest.mark.parametrize("mask", [False, True])
@pytest.mark.parametrize("pos_ids", [False, True])
def test_embed_layer_norm(segments, mask, pos_ids):
    B, S, D, V = 2, 5, 16, 30
    ids = rng.integers(0, V, size=(B, S)).astype(np.int32)
    ins = {"ids": ids, "seg": rng.integers(0, 2, size=(B, S)).astype(np.int32) if segments else None}
    inits = {"W": rng.standard_normal((V, D)).astype(np.float32),
             "P": rng.standard_normal((8, D)).astype(np.float32),
             "SE": rng.standard_normal((2, D)).astype(np.float32) if segments else None,
             "gamma": rng.standard_normal(D).astype(np.float32),
             "beta": rng.standard_normal(D).astype(np.float32)}
    ins["mask"] = (rng.random((B, S)) > 0.3).astype(np.int32) if mask else None
    ins["pos"] = rng.integers(0, 8, size=(B, S)).astype(np.int32) if pos_ids else None
    check_tol("EmbedLayerNormalization", ins, {"epsilon": 1e-5}, initializers=inits, outputs=3,
              output_types=[1, 6, 1], input_order=["ids", "seg", "W", "P", "SE", "gamma", "beta",
                                                    "mask", "pos"])


# ---- activations ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gelu_family(dtype):
    x = rng.standard_normal((2, 3, 8)).astype(dtype) * 3
    b = rng.standard_normal(8).astype(dtype)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == np.float16 else dict(rtol=1e-4, atol=1e-5)
    check_tol("FastGelu", {"x": x}, **tol)
    check_tol("FastGelu", {"x": x, "b": b}, **tol)
    check_tol("BiasGelu", {"x": x, "b": b}, **tol)
    check_tol("Gelu", {"x": x}, **tol)
    check_tol("QuickGelu", {"x": x}, **tol)
    check_tol("QuickGelu", {"x": x}, {"alpha": 1.1}, **tol)


def test_gelu_family_float64():
    # Compared with numpy: ORT's CPU EP has no float64 QuickGelu, and its float64 FastGelu is only
    # float32-accurate (2e-7 off numpy; ours is exact). Gelu/BiasGelu are declined in float64
    # (MLX's erf is float32-accurate) and stay on the CPU EP.
    x = rng.standard_normal((2, 3, 8)) * 3
    b = rng.standard_normal(8)
    tol = dict(rtol=1e-12, atol=1e-14)
    h = x + b
    check_tol("FastGelu", {"x": x, "b": b},
              expected=[0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h ** 3)))], **tol)
    check_tol("QuickGelu", {"x": x}, {"alpha": 1.1}, expected=[x / (1 + np.exp(-float(np.float32(1.1)) * x))], **tol)  # alpha is a float32 attribute
    # (BiasGelu shares the check; ORT has no float64 BiasGelu kernel to fall back to. ORT expands
    # the declined Gelu into its function body, whose nodes are judged on their own.)
    m = make_node_model("Gelu", {"x": x}, 1, domain=MS, output_types=[11])
    assert (MS, "Gelu") not in oracle.placement_of(m, {"x": x}).get(om.EP_NAME, [])


def gelu_ref(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bias_add_and_split_gelu(dtype):
    # ORT's CPU EP has neither kernel (CUDA only): numpy references.
    x = rng.standard_normal((2, 4, 16)).astype(dtype)
    b = rng.standard_normal(16).astype(dtype)
    skip = rng.standard_normal((2, 4, 16)).astype(dtype)
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == np.float16 else dict(rtol=1e-5, atol=1e-6)
    ref = (x.astype(np.float64) + b + skip).astype(dtype)
    check_tol("BiasAdd", {"x": x, "b": b, "skip": skip}, expected=[ref], **tol)
    h = x.astype(np.float64) + b
    ref = (h[..., :8] * gelu_ref(h[..., 8:])).astype(dtype)
    check_tol("BiasSplitGelu", {"x": x, "b": b}, expected=[ref], **tol)


# ---- MultiHeadAttention / Attention (com.microsoft) ----------------------------------------

def mha_check(B=2, S=4, L=None, N=2, H=8, Hv=None, form="3d", bias=False, mask=None, attn_bias=False,
              past=None, unidirectional=0, scale=None, dtype=np.float32, rtol=1e-4, atol=1e-5):
    L = S if L is None else L
    Hv = H if Hv is None else Hv
    f = lambda *shape: rng.standard_normal(shape).astype(dtype)
    ins = {}
    if form == "packed_qkv":
        ins.update(query=f(B, S, N, 3, H), key=None, value=None)
    elif form == "packed_kv":
        ins.update(query=f(B, S, N * H), key=f(B, L, N, 2, H), value=None)
    elif form == "bnsh":
        ins.update(query=f(B, S, N * H), key=f(B, N, L, H), value=f(B, N, L, Hv))
    else:
        ins.update(query=f(B, S, N * H), key=f(B, L, N * H), value=f(B, L, N * Hv))
    ins["bias"] = f(2 * N * H + N * Hv) if bias else None
    T = L + (past or 0)
    if mask == "1d":
        ins["mask"] = rng.integers(1, T + 1, size=B).astype(np.int32)
    elif mask == "2d":
        ins["mask"] = (rng.random((B, T)) > 0.3).astype(np.int32)
        ins["mask"][:, 0] = 1
    elif mask == "3d":
        ins["mask"] = (rng.random((B, S, T)) > 0.3).astype(np.int32)
        ins["mask"][..., 0] = 1
    else:
        ins["mask"] = None
    ins["attention_bias"] = f(1, N, S, T) if attn_bias else None
    if past:
        ins.update(past_key=f(B, N, past, H), past_value=f(B, N, past, Hv))
    attrs = {"num_heads": N, "unidirectional": unidirectional}
    if scale:
        attrs["scale"] = scale
    t = oracle.tensor_type(np.zeros(0, dtype))
    return check_tol("MultiHeadAttention", ins, attrs, outputs=3 if past else 1,
                     output_types=[t] * 3, rtol=rtol, atol=atol)


@pytest.mark.parametrize("form", ["3d", "bnsh"])
def test_mha_forms(form):
    mha_check(form=form)
    mha_check(form=form, S=3, L=6, mask="2d")


@pytest.mark.parametrize("form", ["packed_qkv", "packed_kv"])
def test_mha_packed(form):
    # ORT's CPU EP implements neither packed layout: the expected output is ORT's on the same
    # tensors unpacked into 3-D query/key/value.
    B, S, N, H = 2, 4, 2, 8
    x = rng.standard_normal((B, S, N, 3 if form == "packed_qkv" else 2, H)).astype(np.float32)
    q = rng.standard_normal((B, S, N * H)).astype(np.float32)
    flat = lambda i: np.ascontiguousarray(x[:, :, :, i].reshape(B, S, N * H))
    if form == "packed_qkv":
        packed = {"query": x, "key": None, "value": None}
        plain = {"query": flat(0), "key": flat(1), "value": flat(2)}
    else:
        packed = {"query": q, "key": x, "value": None}
        plain = {"query": q, "key": flat(0), "value": flat(1)}
    ref = run_cpu(make_node_model("MultiHeadAttention", plain, 1, {"num_heads": N}, domain=MS,
                                  output_types=[1]), plain)
    check_tol("MultiHeadAttention", packed, {"num_heads": N}, expected=ref)


@pytest.mark.parametrize("mask", [None, "1d", "2d", "3d"])
def test_mha_masks_bias_past(mask):
    mha_check(mask=mask, bias=True)
    mha_check(S=1, past=5, mask=mask, bias=True, attn_bias=True)


def test_mha_unidirectional_and_value_head():
    mha_check(S=5, unidirectional=1)
    mha_check(S=2, past=3, unidirectional=1, scale=0.2)
    mha_check(S=3, L=5, Hv=16)


def test_mha_half():
    mha_check(S=4, mask="2d", dtype=np.float16, rtol=2e-2, atol=2e-3)


def attention_ms_check(B=2, S=4, Din=12, N=2, H=8, sizes=None, mask=None, past=None,
                       unidirectional=0, attn_bias=False, dtype=np.float32, rtol=1e-4, atol=1e-5):
    f = lambda *shape: rng.standard_normal(shape).astype(dtype)
    sizes = sizes or [N * H] * 3
    T = S + (past or 0)
    ins = {"input": f(B, S, Din)}
    inits = {"weights": f(Din, sum(sizes)) * 0.5, "bias": f(sum(sizes))}
    if mask == "1d":
        ins["mask"] = rng.integers(1, T + 1, size=B).astype(np.int32)
    elif mask == "1d_left":
        ins["mask"] = np.concatenate([rng.integers(T - 1, T + 1, size=B),
                                      rng.integers(0, 2, size=B)]).astype(np.int32)
    elif mask == "2d":
        ins["mask"] = (rng.random((B, T)) > 0.3).astype(np.int32)
        ins["mask"][:, 0] = 1
    elif mask == "3d":
        ins["mask"] = (rng.random((B, S, T)) > 0.3).astype(np.int32)
        ins["mask"][..., 0] = 1
    else:
        ins["mask"] = None
    ins["past"] = f(2, B, N, past, H) if past else None
    ins["attention_bias"] = f(1, N, S, T) if attn_bias else None
    attrs = {"num_heads": N, "unidirectional": unidirectional}
    if sizes[2] != sizes[0]:
        attrs["qkv_hidden_sizes"] = sizes
    t = oracle.tensor_type(np.zeros(0, dtype))
    return check_tol("Attention", ins, attrs, initializers=inits, outputs=2 if past else 1,
                     output_types=[t, t], rtol=rtol, atol=atol,
                     input_order=["input", "weights", "bias", "mask", "past", "attention_bias"])


@pytest.mark.parametrize("mask", [None, "1d", "1d_left", "2d", "3d"])
def test_attention_ms_masks(mask):
    attention_ms_check(mask=mask)


def test_attention_ms_past_unidirectional_bias():
    attention_ms_check(S=1, past=4, unidirectional=1)
    attention_ms_check(S=3, past=2, unidirectional=1, mask="2d")
    attention_ms_check(S=3, unidirectional=1, mask="1d", attn_bias=True)  # ORT: not with past
    attention_ms_check(S=4, sizes=[16, 16, 32])


def test_attention_ms_half():
    attention_ms_check(dtype=np.float16, mask="2d", rtol=2e-2, atol=2e-2)


# ---- Attention (ai.onnx 23/24) -------------------------------------------------------------

def attention_onnx_check(B=2, S=4, L=None, Nq=4, Nkv=2, H=8, Hv=None, three_d=False, mask=None,
                         past=None, causal=0, softcap=None, qk_mode=None, nonpad=False,
                         opset=23, dtype=np.float32, rtol=1e-4, atol=1e-5):
    L = S if L is None else L
    Hv = H if Hv is None else Hv
    f = lambda *shape: rng.standard_normal(shape).astype(dtype)
    if three_d:
        ins = {"Q": f(B, S, Nq * H), "K": f(B, L, Nkv * H), "V": f(B, L, Nkv * Hv)}
    else:
        ins = {"Q": f(B, Nq, S, H), "K": f(B, Nkv, L, H), "V": f(B, Nkv, L, Hv)}
    T = L + (past or 0)
    if mask == "bool":
        m = rng.random((B, 1, S, T)) > 0.3
        m[..., 0] = True
        ins["mask"] = m
    elif mask == "float":
        ins["mask"] = f(S, T)
    elif mask == "short":  # shorter than the total length: padded with -inf (opset-23 text)
        ins["mask"] = f(B, Nq, S, T - 1)
    else:
        ins["mask"] = None
    expected = None
    if mask == "short":
        # ORT's CPU EP rejects a short mask: its expected output is ORT's with the mask padded.
        padded = dict(ins, mask=np.concatenate([ins["mask"], np.full((B, Nq, S, 1), -np.inf, dtype)], -1))
    if past:
        ins.update(past_key=f(B, Nkv, past, H), past_value=f(B, Nkv, past, Hv))
    else:
        ins.update(past_key=None, past_value=None)
    if nonpad:
        ins["nonpad"] = rng.integers(1, T + 1, size=B).astype(np.int64)
    attrs = {"is_causal": causal}
    if mask == "short":
        padded.update({k: v for k, v in ins.items() if k != "mask"})
    if three_d:
        attrs.update(q_num_heads=Nq, kv_num_heads=Nkv)
    if softcap:
        attrs["softcap"] = softcap
    outputs = 3 if past else 1
    if qk_mode is not None:
        attrs["qk_matmul_output_mode"] = qk_mode
        outputs = 4
    t = oracle.tensor_type(np.zeros(0, dtype))
    if mask == "short":
        expected = run_cpu(make_node_model("Attention", padded, outputs, attrs, opset=opset,
                                           output_types=[t] * outputs), 
                           {k: v for k, v in padded.items() if v is not None})
    return check_tol("Attention", ins, attrs, outputs=outputs, output_types=[t] * outputs,
                     opset=opset, domain="", rtol=rtol, atol=atol, expected=expected)


@pytest.mark.parametrize("three_d", [False, True])
@pytest.mark.parametrize("mask", [None, "bool", "float", "short"])
def test_attention_onnx(three_d, mask):
    attention_onnx_check(three_d=three_d, mask=mask)
    attention_onnx_check(three_d=three_d, mask=mask, causal=1, S=3, past=4)


def test_attention_onnx_softcap_qk_outputs():
    attention_onnx_check(softcap=2.0)
    for mode in range(4):
        attention_onnx_check(qk_mode=mode, softcap=1.5, mask="float", past=2)


def test_attention_onnx_cross_and_value_head():
    attention_onnx_check(S=3, L=6, Hv=16)
    attention_onnx_check(S=3, L=6, causal=1, Nq=2, Nkv=2)


def test_attention_onnx24_nonpad():
    attention_onnx_check(S=3, L=7, nonpad=True, opset=24)


def test_attention_onnx_half():
    attention_onnx_check(mask="bool", dtype=np.float16, causal=1, rtol=2e-2, atol=2e-3)


# ---- bfloat16 --------------------------------------------------------------------------------

def bf16_check(op, f32_inputs, attrs, *, initializers=None, input_order=None, n_out=1, domain=MS,
               opset=oracle.DEFAULT_OPSET, rtol=3e-2, atol=3e-2):
    """ORT's CPU EP has no bfloat16 kernels for these ops (and numpy cannot feed bfloat16 to ORT's
    Python API), so the op runs in bfloat16 between Casts on MLX and is compared with the float32
    model on the CPU EP, within bfloat16's rounding. Float inputs are cast; integer ones are not."""
    from onnx import TensorProto, helper, numpy_helper
    initializers = initializers or {}
    order = input_order or (list(f32_inputs) + list(initializers))
    nodes, g_inputs, inits, node_in = [], [], [], []
    for name in order:
        a = f32_inputs.get(name, initializers.get(name))
        if a is None:
            node_in.append("")
            continue
        if name in f32_inputs:
            g_inputs.append(helper.make_tensor_value_info(name, oracle.tensor_type(a), list(a.shape)))
        else:
            inits.append(numpy_helper.from_array(a, name))
        if a.dtype == np.float32:
            nodes.append(helper.make_node("Cast", [name], [name + "_bf"], to=TensorProto.BFLOAT16))
            node_in.append(name + "_bf")
        else:
            node_in.append(name)
    outs = [f"y{i}" for i in range(n_out)]
    nodes.append(helper.make_node(op, node_in, [o + "_bf" for o in outs], domain=domain, **attrs))
    nodes += [helper.make_node("Cast", [o + "_bf"], [o], to=TensorProto.FLOAT) for o in outs]
    g = helper.make_graph(nodes, "bf16", g_inputs, [helper.make_tensor_value_info(o, 1, None) for o in outs],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    m.ir_version = 10
    ref_model = make_node_model(op, f32_inputs, n_out, attrs, initializers, opset, domain,
                                output_types=[1] * n_out, input_order=order)
    feeds = {k: v for k, v in f32_inputs.items() if v is not None}
    ref = run_cpu(ref_model, feeds)
    got, placed = run_mlx(m, feeds)
    assert set(placed) == {om.EP_NAME}, placed
    for a, e in zip(got, ref):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol)


def test_bf16_matmul_nbits():
    B, scales, zp = nbits_weights(64, 24, 4, 32, "u8")
    bf16_check("MatMulNBits", {"A": rng.standard_normal((3, 64)).astype(np.float32)},
               {"K": 64, "N": 24, "bits": 4, "block_size": 32},
               initializers={"B": B, "scales": scales.astype(np.float32), "zp": zp})


def test_bf16_gqa_and_norms():
    B, S, N, Nkv, H = 1, 4, 4, 2, 16
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    cos, sin = rope_cache(8, H)
    bf16_check("GroupQueryAttention",
               {"q": f(B, S, N * H), "k": f(B, S, Nkv * H), "v": f(B, S, Nkv * H),
                "seqlens_k": np.array([S - 1], np.int32), "total": np.array(S, np.int32)},
               {"num_heads": N, "kv_num_heads": Nkv, "do_rotary": 1},
               initializers={"cos": cos, "sin": sin}, n_out=3,
               input_order=["q", "k", "v", "pk", "pv", "seqlens_k", "total", "cos", "sin"])
    x = f(2, 3, 32)
    bf16_check("SkipSimplifiedLayerNormalization", {"x": x, "s": f(2, 3, 32), "g": f(32)}, {})
    bf16_check("FastGelu", {"x": x}, {})


@pytest.mark.parametrize("M", [1, 5])  # one row: the CPU row kernel; more: the graph path
def test_matmul_nbits_int8_emulation_off(M):
    # int8_emulation=0 keeps A in float at accuracy_level 4 (the GPU default): the result is the
    # float product with the dequantized weight, which the int8 path misses by ~1% of a dot.
    K, N, block = 3 * 32 + 8, 24, 32
    B, scales, zp, w = nbits_weights(K, N, 4, block, "u8", np.float32, want_ref=True)
    a = rng.standard_normal((M, K)).astype(np.float32)
    model = make_node_model("MatMulNBits", {"A": a}, 1,
                            {"K": K, "N": N, "bits": 4, "block_size": block, "accuracy_level": 4},
                            {"B": B, "scales": scales, "zp": zp}, oracle.DEFAULT_OPSET, MS,
                            output_types=[oracle.tensor_type(a)], input_order=["A", "B", "scales", "zp"])
    ref = a.astype(np.float64) @ w.T
    off, placed = oracle.run_mlx(model, {"A": a}, int8_emulation=0)
    assert set(placed) == {om.EP_NAME}, placed
    np.testing.assert_allclose(off[0], ref, rtol=1e-4, atol=1e-4)
    on, _ = oracle.run_mlx(model, {"A": a}, int8_emulation=1)
    assert np.max(np.abs(on[0] - ref)) > 10 * np.max(np.abs(off[0] - ref))  # the switch acts


@pytest.mark.parametrize("op", ["MatMul", "MatMulNBits"])
def test_sibling_products_fused(op, capfd):
    """Products of one input by constant weights run as one product and a split (option
    fuse_matmuls, graph/fuse_matmuls): each output equals ORT's CPU EP and the unfused run, and
    the fused run evaluates fewer products. Broken by weights concatenated in the wrong order
    or along the wrong axis, or by a rewrite that no longer happens."""
    import re
    from onnx import helper
    K, Ns, block = 64, (24, 40, 8), 32
    x = rng.standard_normal((1, 1, K)).astype(np.float32)
    nodes, inits = [], []
    for i, N in enumerate(Ns):
        if op == "MatMul":
            inits.append(numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), f"w{i}"))
            nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]))
        else:
            B, scales, zp = nbits_weights(K, N, 4, block, "u8")
            inits += [numpy_helper.from_array(B, f"b{i}"), numpy_helper.from_array(scales, f"s{i}"),
                      numpy_helper.from_array(zp, f"z{i}")]
            nodes.append(helper.make_node("MatMulNBits", ["x", f"b{i}", f"s{i}", f"z{i}"], [f"y{i}"], domain=MS,
                                          K=K, N=N, bits=4, block_size=block))
    graph = helper.make_graph(nodes, "siblings", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(3)],
                              inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    m.ir_version = 10

    def products(fuse):
        capfd.readouterr()
        outs, placed = run_mlx(m, {"x": x}, fuse_matmuls=fuse, log_level=3)
        assert set(placed) == {om.EP_NAME}, placed
        line = [ln for ln in capfd.readouterr().err.splitlines() if " evaluates:" in ln][-1]
        counts = dict(re.findall(r" (\w+)=(\d+)", line.split(" evaluates:")[1]))
        return outs, sum(int(v) for k, v in counts.items() if re.search("Matmul|Gemv|Quantized", k))

    fused, n_fused = products(1)
    apart, n_apart = products(0)
    assert n_fused < n_apart, (n_fused, n_apart)
    for a, b, r in zip(fused, apart, run_cpu(m, {"x": x})):
        assert a.shape == r.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(a, r, rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(oracle.DEVICE != "cpu", reason="the CPU device's attention kernel")
@pytest.mark.parametrize("past", [None, 6])
@pytest.mark.parametrize("avx512", ["1", "0"])
def test_gqa_prompt_through_the_cpu_attention_kernel(past, avx512, capfd):
    """A GroupQueryAttention prompt on the CPU with AVX-512: one FusedAttention primitive
    (grouped heads read in place, K/V head = head / 4; the causal rule bottom-right aligned
    over a past of 6 rows; 19 query rows, not a multiple of the kernel's four); with
    cpu_avx512=0 the explicit math. Outputs and presents equal ORT's CPU EP."""
    from onnxruntime_mlx.doctor import cpu_flags
    if avx512 == "1" and not {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= cpu_flags():
        pytest.skip("no AVX-512 here")
    capfd.readouterr()
    gqa_check(B=1 if past else 2, S=19, N=8, Nkv=2, H=32, past=past, rotary=True, cpu_avx512=avx512, log_level=3)
    err = capfd.readouterr().err
    fused = [ln for ln in err.splitlines() if "evaluates:" in ln and "FusedAttention" in ln]
    assert bool(fused) == (avx512 == "1"), err[-2000:]


@pytest.mark.skipif(oracle.DEVICE != "cpu", reason="the CPU device's layout kernel")
@pytest.mark.parametrize("packed,rotary,interleaved,rot_dim,past,S,H", [
    (True, True, False, None, 0, 19, 64), (False, True, True, None, None, 7, 32),
    (True, True, False, 16, 5, 6, 48), (False, False, False, None, None, 33, 40),
    (True, True, False, None, 0, 64, 64)])
def test_gqa_prompt_inputs_are_laid_out_by_one_kernel(packed, rotary, interleaved, rot_dim, past, S, H, capfd):
    """A prompt of one sequence on the CPU (an empty past as genai's first step, no past inputs, or
    a chunk after a past of 5 rows) lays out its q, k and v per head, q and k rotated at their
    positions (halves, interleaved or the first 16 of 48), as one GqaLayout primitive
    (kernels/cpu/decode_attention.cc; 64 x 64 rows x heads split over the threads); with
    cpu_gqa_prompt=0 the composed ops. Outputs and presents equal ORT's CPU EP either way."""
    for opts, kernel in (({}, True), ({"cpu_gqa_prompt": 0}, False)):
        capfd.readouterr()
        gqa_check(B=1, S=S, N=8, Nkv=2, H=H, past=past, packed=packed, rotary=rotary, interleaved=interleaved,
                  rot_dim=rot_dim, log_level=3, **opts)
        err = capfd.readouterr().err
        assert any("evaluates:" in ln and "GqaLayout" in ln for ln in err.splitlines()) == kernel, (opts, err[-2000:])


def _decode_kernel_ran(err):
    return any("evaluates:" in ln and "DecodeGqa" in ln for ln in err.splitlines())


@pytest.mark.parametrize("packed,rotary,interleaved,rot_dim,window,H,past", [
    (True, True, False, None, -1, 64, 37), (False, True, True, None, 5, 64, 37),
    (True, True, False, 16, -1, 48, 37), (False, False, False, None, 3, 40, 11),
    (True, True, False, None, -1, 64, 1100), (False, True, False, None, -1, 128, 70)])
@pytest.mark.parametrize("avx512", ["1", "0"])
def test_gqa_decode_step_is_one_kernel(packed, rotary, interleaved, rot_dim, window, H, past, avx512, capfd):
    """A decode step of one sequence on the CPU (a growing cache: present = past + the step's
    row) is one DecodeGqa primitive (kernels/cpu/decode_attention.cc): rotary halves,
    interleaved or partial, a window, head sizes off the 16-float loop, grouped heads
    (4 query heads a KV head), and a long past (its heads split over two threads); head sizes
    64 and 128 in AVX-512 registers with cpu_avx512=1. With fused_gqa_step=0 the composed ops.
    Outputs and presents equal ORT's CPU EP."""
    for opts, kernel in (({}, True), ({"fused_gqa_step": 0}, False)):
        capfd.readouterr()
        gqa_check(B=1, S=1, N=8, Nkv=2, H=H, past=past, seqlens=[past], packed=packed, rotary=rotary,
                  interleaved=interleaved, rot_dim=rot_dim, window=window, log_level=3, cpu_avx512=avx512, **opts)
        assert _decode_kernel_ran(capfd.readouterr().err) == kernel, opts


_SHORT_CONTEXT_STEPS = r"""
import json, sys, numpy as np, onnxruntime as ort, onnxruntime_mlx as om
from onnx import TensorProto as TP, helper
report = sys.argv[1]
N, Nkv, H, P, pos = 8, 4, 64, 256, 127
rng = np.random.default_rng(3)
node = helper.make_node("GroupQueryAttention", ["q", "", "", "pk", "pv", "seqlens", "total"], ["o", "k", "v"],
                        domain="com.microsoft", num_heads=N, kv_num_heads=Nkv)
f = lambda name, shape, t=TP.FLOAT: helper.make_tensor_value_info(name, t, shape)
g = helper.make_graph([node], "g", [f("q", [1, 1, (N + 2 * Nkv) * H]), f("pk", [1, Nkv, P, H]), f("pv", [1, Nkv, P, H]),
                                    f("seqlens", [1], TP.INT32), f("total", [], TP.INT32)],
                      [f("o", None), f("k", None), f("v", None)])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
m.ir_version = 9
feeds = {"q": rng.standard_normal((1, 1, (N + 2 * Nkv) * H)).astype(np.float32),
         "pk": rng.standard_normal((1, Nkv, P, H)).astype(np.float32),
         "pv": rng.standard_normal((1, Nkv, P, H)).astype(np.float32),
         "seqlens": np.array([pos], np.int32), "total": np.array(pos + 1, np.int32)}
want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
s = ort.InferenceSession(m.SerializeToString(), sess_options=om.session_options("cpu", fallback=False,
                                                                               report_path=report, log_level=3))
for _ in range(10):
    np.testing.assert_allclose(s.run(None, feeds)[0], want, rtol=1e-4, atol=1e-5)
del s
line = next(json.loads(ln) for ln in open(report) if '"fused_node"' in ln)
print(json.dumps({"regions": line["process_openmp_regions"]}))
"""


@pytest.mark.skipif(oracle.DEVICE != "cpu" or (os.cpu_count() or 1) < 2, reason="the CPU kernel's threads")
def test_gqa_decode_step_at_a_short_context_splits_its_heads(tmp_path):
    """A decode step at position 127 of a 256-row shared buffer (8 query heads, 4 KV heads of 64:
    the bench's 60M Llama at a 128-token context) splits its KV heads over two threads: its
    products over 128 rows are worth the hand-off to a waiting worker, though the buffer's rows
    are not. Outputs equal ORT's CPU EP. Broken by a size rule that counts the buffer's rows
    (the step then runs on one thread: no parallel region)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _SHORT_CONTEXT_STEPS, str(tmp_path / "r.jsonl")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _decode_kernel_ran(out.stderr), out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["regions"] >= 10, out.stdout


@pytest.mark.parametrize("pos", [0, 17, 39])
def test_gqa_decode_step_in_a_shared_buffer(pos, capfd):
    """One sequence's decode step into a shared past/present buffer of 40 rows (genai's
    past_present_share_buffer) through the CPU kernel: the row lands at seqlens_k and the
    attention sees rows [0, seqlens_k]. ORT leaves a separate present's rows past the step
    unwritten, so presents are compared up to the step's row."""
    N, Nkv, H, P = 8, 2, 64, 40
    f = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    cos, sin = rope_cache(P + 4, H)
    inputs = dict(query=f(1, 1, (N + 2 * Nkv) * H), key=None, value=None, past_key=f(1, Nkv, P, H),
                  past_value=f(1, Nkv, P, H), seqlens_k=np.array([pos], np.int32),
                  total_sequence_length=np.array(pos + 1, np.int32), cos_cache=cos, sin_cache=sin)
    attrs = {"num_heads": N, "kv_num_heads": Nkv, "do_rotary": 1}
    t = oracle.tensor_type(np.zeros(0, np.float32))
    model = make_node_model("GroupQueryAttention", inputs, 3, attrs, None, oracle.DEFAULT_OPSET, MS,
                            output_types=[t] * 3)
    feeds = {k: v for k, v in inputs.items() if v is not None}
    want = run_cpu(model, feeds)
    capfd.readouterr()
    got, placed = run_mlx(model, feeds, log_level=3)
    assert set(placed) == {om.EP_NAME}, placed
    assert _decode_kernel_ran(capfd.readouterr().err)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
    for i in (1, 2):
        assert got[i].shape == want[i].shape == (1, Nkv, P, H)
        np.testing.assert_allclose(got[i][:, :, :pos + 1], want[i][:, :, :pos + 1], rtol=1e-5, atol=1e-6)
