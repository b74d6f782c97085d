"""Greedy decoding for genai-format decoder models (onnxruntime-genai's model builder layout:
input_ids, attention_mask, past_key_values.N.key/value -> logits, present.N.key/value).

The KV cache is kept between steps: each step feeds the previous step's present.* back as past.*.
With the EP's device memory (Decoder(..., device_memory=1), which registers the EP library with
ORT_MLX_DEVICE_MEMORY=1) the present.* outputs are left in the EP's memory (the session's
OrtValue-vector run with their output devices; IOBinding where that is missing or the shared
buffer is bound) and fed back as they are: the cache never crosses to the host; only the
logits do.

With share_buffer=True (onnxruntime-genai's past_present_share_buffer, its default for
GroupQueryAttention models) past and present are one [batch, kv_heads, max_length, head] buffer
per layer, bound as both input and output, and the attention mask is [batch, max_length] (ones
for the tokens so far): every decode step has the same shapes, which lets the EP run the step
as one compiled function.

provider: "mlx" (this EP), "cpu" (ORT's CPU EP) or "cuda" (ORT's CUDA EP, KV kept on the GPU
with IOBinding), the last two as baselines.

    python -m onnxruntime_mlx generate tests/models/llm/llama-fp32 --tokens 64 [--device cpu]
"""
from __future__ import annotations

import collections.abc
import json
import pathlib
import time

import numpy as np
import onnxruntime as ort

DEFAULT_PROMPT = [1, 17, 42, 99, 3, 250, 7, 64]


def uses_group_query_attention(model_path: pathlib.Path) -> bool:
    import onnx
    m = onnx.load(str(model_path), load_external_data=False)
    return any(n.op_type == "GroupQueryAttention" for n in m.graph.node)


class ResidentPast(collections.abc.Mapping):
    """A resident step's present.* as the next step's past (name -> OrtValue in the EP's memory).
    The next step feeds the run's own values back as they came out; the Python wrappers
    (onnxruntime.OrtValue) are made only for the names read here. Why: wrapping two values a
    layer, and unwrapping them again for the next run, cost a decode step more Python time than
    the rest of its Python (after a step's run has streamed the weights through the caches,
    every Python object it touches is a cache miss)."""

    __slots__ = ("raw", "_wrapped")

    def __init__(self, raw: dict):
        self.raw = raw          # name -> the run's OrtValue (onnxruntime's C++ binding)
        self._wrapped = {}

    def __getitem__(self, name: str) -> ort.OrtValue:
        value = self._wrapped.get(name)
        if value is None:
            value = self._wrapped[name] = ort.OrtValue(self.raw[name])
        return value

    def __iter__(self):
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    def wrapped(self) -> int:
        """How many values were read (wrapped) so far."""
        return len(self._wrapped)


class Decoder:
    """One session over a genai-format model, with its KV layout read from genai_config.json."""

    def __init__(self, model_dir: str | pathlib.Path, provider: str = "mlx", device: str = "cpu",
                 share_buffer: bool | str = False, max_length: int | None = None, **provider_options):
        d = pathlib.Path(model_dir)
        self.model_path = d / "model.onnx" if d.is_dir() else d
        cfg = json.loads((self.model_path.parent / "genai_config.json").read_text())["model"]
        dec = cfg["decoder"]
        self.num_layers = dec["num_hidden_layers"]
        self.kv_heads = dec["num_key_value_heads"]
        self.head_size = dec["head_size"]
        self.eos = cfg.get("eos_token_id")
        self.resident = False  # KV kept in the EP's (or CUDA's) memory between steps (IOBinding)
        if share_buffer == "auto":  # genai's choice: its CUDA EP shares the buffer for GQA models
            share_buffer = uses_group_query_attention(self.model_path)
        if share_buffer and not uses_group_query_attention(self.model_path):
            raise ValueError("share_buffer needs a GroupQueryAttention model (the KV length is data "
                             "there; other attention ops size the cache from its shape)")
        self.share_buffer = bool(share_buffer)
        self.max_length = int(max_length or cfg.get("context_length") or 0)
        if share_buffer and self.max_length <= 0:
            raise ValueError("share_buffer needs max_length (genai_config.json has no context_length)")
        if provider == "cuda":
            so = ort.SessionOptions()
            self.session = ort.InferenceSession(str(self.model_path), sess_options=so,
                                                providers=[("CUDAExecutionProvider", provider_options),
                                                           "CPUExecutionProvider"])
            if "CUDAExecutionProvider" not in self.session.get_providers():
                raise RuntimeError("ORT's CUDA EP is not available in this onnxruntime")
            self.resident = True
            self._ep_memory = "cuda"
        elif provider == "mlx":
            import onnxruntime_mlx as om
            if str(provider_options.get("device_memory", "0")) == "1":
                om.register(device_memory=True)
                self.resident = True
                self._ep_memory = om.device_memory_ort_device(device)
            so = om.record_assignment(om.session_options(device, **provider_options))
            self.session = ort.InferenceSession(str(self.model_path), sess_options=so)
        else:
            so = ort.SessionOptions()
            so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
            self.session = ort.InferenceSession(str(self.model_path), sess_options=so,
                                                providers=["CPUExecutionProvider"])
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.vector_runs = 0  # steps run through _step_resident_vector
        self._vector_state = None  # what that path keeps between steps (made on its first)
        self._ones = np.ones((1, 0), np.int64)  # attention masks of no padding are its views
        kv_type = self.inputs["past_key_values.0.key"].type
        self.kv_dtype = {"tensor(float)": np.float32, "tensor(float16)": np.float16}.get(kv_type, np.float32)

    def empty_past(self, batch: int = 1) -> dict:
        """The past of a first prompt: zero rows, or with share_buffer the zeroed buffers."""
        shape = (batch, self.kv_heads, self.max_length if self.share_buffer else 0, self.head_size)
        past = {}
        for i in range(self.num_layers):
            past[f"past_key_values.{i}.key"] = np.zeros(shape, self.kv_dtype)
            past[f"past_key_values.{i}.value"] = np.zeros(shape, self.kv_dtype)
        return past

    def step(self, ids: np.ndarray, past: dict, total_len: int, logits_to_host: bool = True,
             attention_mask: np.ndarray | None = None):
        """One forward pass: (logits as numpy, the next step's past). `past` holds numpy arrays,
        or (resident decoders) the previous step's OrtValues in the EP's memory. The attention
        mask is all ones (no padding) unless given ([batch, total_len] int64).
        logits_to_host=False (resident decoders): the logits stay in the EP's memory too and
        come back as an OrtValue (a prompt's [1, S, vocab] logits are 131 MB at S = 1024 for a
        32k vocabulary; a sampler needs one row of them)."""
        if attention_mask is None:
            width = self.max_length if self.share_buffer else total_len
            if total_len > width:
                raise ValueError(f"{total_len} tokens do not fit the shared buffer of {width}")
            attention_mask = self._ones_mask(ids.shape[0], total_len, width)
        # (contiguous: the vector run wraps the buffer as it is; no copy when ids already are)
        feeds = {"input_ids": np.ascontiguousarray(ids, dtype=np.int64), "attention_mask": attention_mask}
        if "position_ids" in self.inputs:
            s = ids.shape[1]
            feeds["position_ids"] = np.arange(total_len - s, total_len, dtype=np.int64)[None].repeat(ids.shape[0], 0)
        if self.resident and self._vector_run_possible(past):
            return self._step_resident_vector(feeds, past, logits_to_host)
        feeds.update(past)
        if self.resident:
            return self._step_resident(feeds, logits_to_host)
        if self.share_buffer:
            return self._step_shared_host(feeds)
        names = self.output_names
        outs = dict(zip(names, self.session.run(None, feeds)))
        new_past = {}
        for i in range(self.num_layers):
            new_past[f"past_key_values.{i}.key"] = outs[f"present.{i}.key"]
            new_past[f"past_key_values.{i}.value"] = outs[f"present.{i}.value"]
        return outs["logits"], new_past

    def _ones_mask(self, batch: int, total_len: int, width: int) -> np.ndarray:
        """[batch, width] int64, ones for the first total_len positions: for one sequence without
        padding a view of a kept row of ones (a decode loop's mask grows by one each step)."""
        if width != total_len or batch != 1:
            mask = np.zeros((batch, width), np.int64)
            mask[:, :total_len] = 1
            return mask
        if self._ones.shape[1] < total_len:
            self._ones = np.ones((1, max(2 * total_len, 256)), np.int64)
        return self._ones[:, :total_len]

    @staticmethod
    def _past_name(present: str) -> str:
        return present.replace("present.", "past_key_values.", 1)

    def _bind_output(self, io, name: str) -> None:
        if isinstance(self._ep_memory, str):
            io.bind_output(name, self._ep_memory)
        else:
            io._iobinding.bind_output(name, self._ep_memory)

    def _step_shared_host(self, feeds: dict):
        """share_buffer with host memory: each layer's buffer is one OrtValue, input and output."""
        io = self.session.io_binding()
        for k, v in feeds.items():
            if k.startswith("past_key_values.") and isinstance(v, np.ndarray):
                v = ort.OrtValue.ortvalue_from_numpy(v)
                feeds[k] = v
            if isinstance(v, np.ndarray):
                io.bind_cpu_input(k, v)
            else:
                io.bind_ortvalue_input(k, v)
        names = self.output_names
        for n in names:
            if n.startswith("present."):
                io.bind_ortvalue_output(n, feeds[self._past_name(n)])
            else:
                io.bind_output(n)
        self.session.run_with_iobinding(io)
        outs = dict(zip(names, io.get_outputs()))
        new_past = {self._past_name(n): feeds[self._past_name(n)] for n in names if n.startswith("present.")}
        return outs["logits"].numpy(), new_past

    def _step_resident(self, feeds: dict, logits_to_host: bool = True):
        io = self.session.io_binding()
        for k, v in feeds.items():
            if isinstance(v, np.ndarray):
                io.bind_cpu_input(k, v)       # token ids, mask, the empty past of a prompt
            else:
                io.bind_ortvalue_input(k, v)  # last step's present, where the EP left it
        names = self.output_names
        for n in names:
            if n == "logits" and logits_to_host:
                io.bind_output(n)             # to the host: ORT copies it out of EP memory
            elif self.share_buffer and n.startswith("present.") and not isinstance(feeds[self._past_name(n)], np.ndarray):
                io.bind_ortvalue_output(n, feeds[self._past_name(n)])  # the same buffer
            else:
                self._bind_output(io, n)
        self.session.run_with_iobinding(io)
        outs = dict(zip(names, io.get_outputs()))
        new_past = {}
        for i in range(self.num_layers):
            new_past[f"past_key_values.{i}.key"] = outs[f"present.{i}.key"]
            new_past[f"past_key_values.{i}.value"] = outs[f"present.{i}.value"]
        return (outs["logits"].numpy() if logits_to_host else outs["logits"]), new_past

    def _vector_run_possible(self, past) -> bool:
        """The EP's memory (not CUDA's), no output bound to a given buffer (shared KV) and the
        binding's entry point in this onnxruntime."""
        if not hasattr(self.session, "_sess") or not hasattr(self.session._sess, "run_with_ortvaluevector"):
            return False
        if isinstance(self._ep_memory, str):
            return False
        return not (self.share_buffer and (isinstance(past, ResidentPast) or
                                           any(not isinstance(v, np.ndarray) for v in past.values())))

    def _step_resident_vector(self, feeds: dict, past, logits_to_host: bool = True):
        """The resident step through the session's OrtValue-vector run: the same session Run an
        IOBinding reaches (the present.* outputs allocated in the EP's memory, the logits on the
        host or there), without an IOBinding's per-step construction and per-name bind calls,
        which cost more Python time a step than the CPU EP's session.run. `feeds`: the host
        inputs (numpy); `past`: numpy arrays (a prompt), OrtValues, or the last step's
        ResidentPast, whose values go back in as the run gave them."""
        from onnxruntime.capi import _pybind_state as C
        if self._vector_state is None:
            host = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
            devices = {h: [host if n == "logits" and h else self._ep_memory for n in self.output_names]
                       for h in (True, False)}
            pasts = [(i, self._past_name(n)) for i, n in enumerate(self.output_names) if n.startswith("present.")]
            self._vector_state = (host, C.RunOptions(), devices, pasts, self.output_names.index("logits"), {})
        host, run_options, devices, pasts, logits_at, names_memo = self._vector_state
        values = C.OrtValueVector()
        for v in feeds.values():
            values.push_back(C.OrtValue.ortvalue_from_numpy(v, host))
        if isinstance(past, ResidentPast):
            for v in past.raw.values():
                values.push_back(v)
        else:
            for v in past.values():
                values.push_back(C.OrtValue.ortvalue_from_numpy(v, host) if isinstance(v, np.ndarray) else v._ortvalue)
        key = (tuple(feeds), tuple(past))
        names = names_memo.get(key)
        if names is None:
            names = names_memo[key] = list(key[0] + key[1])
        fetches = C.OrtValueVector()
        self.session._sess.run_with_ortvaluevector(run_options, names, values, self.output_names, fetches,
                                                   devices[logits_to_host])
        self.vector_runs += 1
        # By index: the vector's iterator ties each item to the vector (a pybind keep-alive),
        # which costs more than the item.
        new_past = ResidentPast({name: fetches[i] for i, name in pasts})
        logits = fetches[logits_at]
        return (logits.numpy() if logits_to_host else ort.OrtValue(logits)), new_past

    def generate(self, prompt: list[int], tokens: int) -> tuple[list[int], list[np.ndarray], dict]:
        """Greedy decode: returns (new token ids, last-position logits per step, timings)."""
        ids = np.array([prompt], np.int64)
        past = self.empty_past()
        out, logits_per_step = [], []
        t0 = time.perf_counter()
        logits, past = self.step(ids, past, len(prompt))
        t_prefill = time.perf_counter() - t0
        total = len(prompt)
        t1 = time.perf_counter()
        for _ in range(tokens):
            last = logits[0, -1].astype(np.float32)
            logits_per_step.append(last)
            nxt = int(np.argmax(last))
            out.append(nxt)
            if len(out) == tokens:
                break
            total += 1
            logits, past = self.step(np.array([[nxt]], np.int64), past, total)
        t_decode = time.perf_counter() - t1
        timing = {"prefill_s": t_prefill, "decode_s": t_decode,
                  "decode_tok_s": (len(out) - 1) / t_decode if t_decode > 0 and len(out) > 1 else 0.0}
        return out, logits_per_step, timing


def add_arguments(p) -> None:
    p.add_argument("model", help="model directory (with genai_config.json) or model.onnx")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prompt", default="", help="comma-separated token ids")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "gpu"])
    p.add_argument("--compare", action="store_true", help="also decode on ORT's CPU EP")
    p.add_argument("--loop", choices=["package", "genai"], default="package",
                   help="whose decode loop: this package's Decoder (default) or "
                        "onnxruntime-genai's Generator with the MLX EP as its provider")
    p.add_argument("--kv", choices=["grow", "shared"], default="grow",
                   help="KV cache: grown every step (default), or one max-length buffer "
                        "shared by past and present (genai's past_present_share_buffer)")


def genai_generate(model: str | pathlib.Path, prompt: list[int], tokens: int,
                   provider: str = "mlx", device: str = "cpu", share_buffer: bool = False,
                   **provider_options) -> tuple[list[int], dict]:
    """Greedy decoding through onnxruntime-genai's own loop (og.Generator): (new tokens,
    timings). provider "mlx" (this EP, through onnxruntime_mlx.genai.config) or "cpu"."""
    import onnxruntime_genai as og
    d = pathlib.Path(model)
    d = d if d.is_dir() else d.parent
    if provider == "mlx":
        from onnxruntime_mlx import genai
        cfg = genai.config(d, device, **provider_options)
    else:
        cfg = og.Config(str(d))
        cfg.clear_providers()
    m = og.Model(cfg)
    params = og.GeneratorParams(m)
    params.set_search_options(max_length=len(prompt) + tokens, do_sample=False,
                              past_present_share_buffer=share_buffer)
    gen = og.Generator(m, params)
    t0 = time.perf_counter()
    gen.append_tokens(np.array(prompt, np.int32))  # the prompt's run
    t_prefill = time.perf_counter() - t0
    t1 = time.perf_counter()
    n = 0
    while not gen.is_done():
        gen.generate_next_token()  # picks a token from the last logits, then runs the next step
        n += 1
    t_decode = time.perf_counter() - t1
    out = [int(t) for t in gen.get_sequence(0)][len(prompt):]
    del gen, params, m
    return out, {"prefill_s": t_prefill, "decode_s": t_decode,
                 "decode_tok_s": (n - 1) / t_decode if t_decode > 0 and n > 1 else 0.0}


def parse_prompt(text: str) -> list[int]:
    """--prompt's comma-separated token ids (a tokenizer is not part of this command)."""
    import onnxruntime_mlx as om
    if not text:
        return DEFAULT_PROMPT
    items = [t.strip() for t in text.split(",")]
    if not all(t.isdigit() for t in items):
        raise om.UsageError(f"--prompt takes comma-separated token ids such as 1,17,42 (this "
                            f"command has no tokenizer), got {text!r}")
    return [int(t) for t in items]


def check_model(model: str) -> None:
    """A UsageError unless `model` is a genai-format LLM folder (or its model.onnx)."""
    import onnxruntime_mlx as om
    d = pathlib.Path(model)
    onnx_path = d / "model.onnx" if d.is_dir() else d
    if not onnx_path.is_file():
        raise om.UsageError(f"no such model: {onnx_path}")
    cfg = onnx_path.parent / "genai_config.json"
    if not cfg.is_file():
        raise om.UsageError(f"{model} is not a genai-format LLM: no genai_config.json next to "
                            f"{onnx_path.name} (generate needs its decoder section)")
    try:
        dec = json.loads(cfg.read_text())["model"]["decoder"]
        for key in ("num_hidden_layers", "num_key_value_heads", "head_size"):
            dec[key]
    except (ValueError, KeyError, TypeError) as e:
        raise om.UsageError(f"{cfg} has no model.decoder.{e} entry (is it onnxruntime-genai's "
                            "format?)") from None


def run(args) -> int:
    import onnxruntime_mlx as om
    prompt = parse_prompt(args.prompt)
    check_model(args.model)
    if args.tokens < 1:
        raise om.UsageError("--tokens must be >= 1")
    om.ep_devices(args.device)  # device='gpu' without a GPU: one line, before any work
    share = args.kv == "shared"
    if args.loop == "genai":
        return _run_genai(args, prompt, share)
    dec = Decoder(args.model, "mlx", args.device, share_buffer=share)
    tokens, _, timing = dec.generate(prompt, args.tokens)
    placed = om.placement(dec.session)
    on_mlx = len(placed.get(om.EP_NAME, []))
    total = sum(len(v) for v in placed.values())
    print(f"tokens: {tokens}")
    print(f"nodes on {om.EP_NAME}: {on_mlx}/{total}")
    print(f"prefill {timing['prefill_s'] * 1e3:.1f} ms, decode {timing['decode_tok_s']:.1f} tok/s")
    if args.compare:
        cpu = Decoder(args.model, "cpu", share_buffer=share)
        ref, _, ref_t = cpu.generate(prompt, args.tokens)
        same = sum(a == b for a, b in zip(tokens, ref))
        print(f"CPU EP tokens equal: {same}/{len(ref)}; CPU EP decode {ref_t['decode_tok_s']:.1f} tok/s")
    return 0


def _run_genai(args, prompt: list[int], share: bool) -> int:
    """`generate --loop genai`: placement from the EP's report (genai exposes no session)."""
    import gc
    import os
    import tempfile

    import onnxruntime_mlx as om
    from onnxruntime_mlx import runner
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        raise om.UsageError("--loop genai needs onnxruntime-genai (pip install "
                            "onnxruntime-genai)") from None
    fd, report = tempfile.mkstemp(prefix="ortmlx-genai-", suffix=".jsonl")
    os.close(fd)
    try:
        tokens, timing = genai_generate(args.model, prompt, args.tokens, "mlx", args.device,
                                        share, report_path=report)
        gc.collect()
        fused = runner.read_fused_node_stats(report)
        declined = [r for r in runner.read_report(report) if "reason" in r]
    finally:
        os.unlink(report)
    print(f"tokens: {tokens}")
    print(f"onnxruntime-genai Generator on {om.EP_NAME}: {len(fused)} fused node(s), runs "
          f"{[f['runs'] for f in fused]}, {len(declined)} node(s) declined")
    print(f"prefill {timing['prefill_s'] * 1e3:.1f} ms, decode {timing['decode_tok_s']:.1f} tok/s")
    if args.compare:
        ref, ref_t = genai_generate(args.model, prompt, args.tokens, "cpu", share_buffer=share)
        same = sum(a == b for a, b in zip(tokens, ref))
        print(f"genai on the CPU EP: tokens equal {same}/{len(ref)}; decode "
              f"{ref_t['decode_tok_s']:.1f} tok/s")
    return 0
