"""onnxruntime-genai on the MLX EP: genai's own generation loop (og.Generator) with the MLX EP
as its execution provider.

    import onnxruntime_genai as og
    from onnxruntime_mlx import genai
    model = og.Model(genai.config("path/to/model_dir", device="cpu"))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=64, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt_ids)
    while not generator.is_done():
        generator.generate_next_token()
    tokens = generator.get_sequence(0)

A genai_config.json can name the EP itself ("provider_options": [{"MLXExecutionProvider":
{"device": "cpu"}}]) once register() has run. genai treats a plugin EP it does not know as a
CPU device: its KV cache and logits stay in host memory, and past_present_share_buffer binds
host buffers, which the EP reads and writes in place.
"""
from __future__ import annotations

import os

import onnxruntime_mlx as om

_registered = False


def register() -> str:
    """Registers the EP library with onnxruntime-genai (once per process); returns its path."""
    global _registered
    import onnxruntime_genai as og
    path = om.get_library_path()
    if not _registered:
        om._preload_mlx(path)
        og.register_execution_provider_library(om.REGISTRATION_NAME, path)
        _registered = True
    return path


def config(model_dir: str | os.PathLike, device: str = "auto", **provider_options):
    """An og.Config for `model_dir` with the MLX EP as its only provider (genai's own
    provider entries are cleared) and `provider_options` checked as session_options() checks
    them (OptionError before genai sees them)."""
    import onnxruntime_genai as og
    opts = om.validate_options(provider_options)
    om.ep_devices(device)  # OptionError / DeviceUnavailableError now, not inside genai
    register()
    cfg = og.Config(os.fspath(model_dir))
    cfg.clear_providers()
    cfg.append_provider(om.EP_NAME)
    if device != "auto":
        opts.setdefault("device", device)
    for key, value in opts.items():
        cfg.set_provider_option(om.EP_NAME, key, value)
    return cfg
