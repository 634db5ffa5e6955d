#!/usr/bin/env python3
"""Golden fixtures for YaRN RoPE and MXFP4 dequantization (gpt-oss).

Writes ``tests/fixtures/golden/rope_mxfp4/`` (or ``--out``):

* ``yarn_cases.json``: ``{"generator", "versions", "positions": [...],
  "cases": [{"name", "config": {...}}]}``. Each ``config`` is the text of a
  config.json (a Llama config: 4.x ``rope_theta`` + ``rope_scaling`` or 5.x
  ``rope_parameters``) that the C++ test parses with its own reader, and
  ``attention_factor`` (float) is transformers' value for it.
* ``yarn.safetensors``, per case ``<name>.inv_freq`` float32 [rotary_dim / 2]
  from ``ROPE_INIT_FUNCTIONS["yarn"]`` and ``<name>.cos`` / ``<name>.sin``
  float32 [len(positions), rotary_dim] from ``LlamaRotaryEmbedding`` at
  ``positions`` (batch 1; for the gpt-oss case ``GptOssRotaryEmbedding``'s
  half-width tables are checked here to equal the first halves).
* ``mxfp4.safetensors``: ``<case>.blocks`` uint8 [*prefix, G, 16],
  ``<case>.scales`` uint8 [*prefix, G] and ``<case>.<dtype>`` (bf16, f16,
  f32) from transformers' ``convert_moe_packed_tensors(blocks, scales,
  dtype=...)``. Case ``experts``: [3, 5, 4, 16], its first 256 bytes 0..255
  (every nibble pair), scales covering 0, 1, 126, 127, 128, 253, 254 and
  random ones; ``rank5``: [2, 3, 2, 5, 16]; ``scale255``: scale byte 255
  (2^128: inf, and NaN for zeros), bf16 only.

Run with the versions in tools/golden/requirements.txt:

    .venv/bin/python tools/golden/make_rope_mxfp4_golden.py
"""

import argparse
import json
import os

import torch
import transformers
from safetensors.torch import save_file
from transformers import GptOssConfig, LlamaConfig
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

POSITIONS = [0, 1, 2, 7, 100, 1000, 4095, 4096, 12345, 65536, 131071]


def base(head_dim, **extra):
    config = {
        "model_type": "llama",
        "vocab_size": 32,
        "hidden_size": 64,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": head_dim,
        "max_position_embeddings": 8192,
    }
    config.update(extra)
    return config


YARN_CASES = [
    # gpt-oss-20b / 120b as released (4.x spelling, no truncation).
    ("gpt_oss", base(64, rope_theta=150000.0, max_position_embeddings=131072,
                     rope_scaling={"rope_type": "yarn", "factor": 32.0,
                                   "beta_fast": 32.0, "beta_slow": 1.0,
                                   "original_max_position_embeddings": 4096,
                                   "truncate": False})),
    # 5.x spelling, defaults: betas 32 / 1, truncate true.
    ("defaults_v5", base(128, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
        "original_max_position_embeddings": 2048})),
    # Other betas; the original context from max_position_embeddings.
    ("betas_from_max", base(96, rope_theta=500000.0,
                            max_position_embeddings=4096,
                            rope_scaling={"type": "yarn", "factor": 8,
                                          "beta_fast": 16, "beta_slow": 2})),
    # Half the head rotated, explicit attention_factor, no truncation.
    ("partial_explicit", base(64, rope_theta=10000.0,
                              partial_rotary_factor=0.5,
                              rope_scaling={"rope_type": "yarn",
                                            "factor": 2.5,
                                            "attention_factor": 1.2,
                                            "original_max_position_embeddings":
                                                1024,
                                            "truncate": False})),
    # DeepSeek-style mscale / mscale_all_dim.
    ("mscale", base(64, rope_theta=10000.0, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
        "mscale": 1.0, "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 4096})),
    # A top-level original_max_position_embeddings wins over the settings'.
    ("top_level_original", base(32, rope_theta=1000000.0,
                                original_max_position_embeddings=1024,
                                rope_scaling={
                                    "rope_type": "yarn", "factor": 16.0,
                                    "original_max_position_embeddings":
                                        4096})),
    # beta_fast == beta_slow untruncated: the ramp's 0.001 guard.
    ("equal_betas", base(16, rope_theta=10000.0, rope_scaling={
        "rope_type": "yarn", "factor": 2.0, "beta_fast": 4.0,
        "beta_slow": 4.0, "original_max_position_embeddings": 512,
        "truncate": False})),
]


def hf_config(cls, config):
    kwargs = {k: v for k, v in config.items() if k != "model_type"}
    return cls(**json.loads(json.dumps(kwargs)))


def yarn_fixtures(out):
    tensors = {}
    cases = []
    position_ids = torch.tensor([POSITIONS], dtype=torch.int64)
    for name, config in YARN_CASES:
        llama = hf_config(LlamaConfig, config)
        assert llama.rope_parameters["rope_type"] == "yarn", name
        inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](llama, "cpu")
        rotary = LlamaRotaryEmbedding(llama)
        assert torch.equal(rotary.inv_freq, inv_freq), name
        assert rotary.attention_scaling == attention_factor, name
        x = torch.zeros(1, dtype=torch.float32)
        cos, sin = rotary(x, position_ids)
        if name == "gpt_oss":
            oss = GptOssRotaryEmbedding(hf_config(GptOssConfig, config))
            oss_cos, oss_sin = oss(x, position_ids)
            half = inv_freq.numel()
            assert torch.equal(oss_cos, cos[..., :half]), name
            assert torch.equal(oss_sin, sin[..., :half]), name
        tensors[f"{name}.inv_freq"] = inv_freq.contiguous()
        tensors[f"{name}.cos"] = cos[0].contiguous()
        tensors[f"{name}.sin"] = sin[0].contiguous()
        cases.append({"name": name, "config": config,
                      "attention_factor": float(attention_factor)})
    save_file(tensors, os.path.join(out, "yarn.safetensors"))
    with open(os.path.join(out, "yarn_cases.json"), "w") as f:
        json.dump({"generator": "tools/golden/make_rope_mxfp4_golden.py",
                   "versions": {"torch": torch.__version__,
                                "transformers": transformers.__version__},
                   "positions": POSITIONS, "cases": cases}, f, indent=1)
        f.write("\n")


def mxfp4_fixtures(out):
    gen = torch.Generator().manual_seed(20250805)
    tensors = {}

    blocks = torch.randint(0, 256, (3, 5, 4, 16), generator=gen,
                           dtype=torch.uint8)
    blocks.view(-1)[:256] = torch.arange(256, dtype=torch.uint8)
    scales = torch.randint(100, 155, (3, 5, 4), generator=gen,
                           dtype=torch.uint8)
    extremes = torch.tensor([0, 1, 126, 127, 128, 253, 254], dtype=torch.uint8)
    # The extremes on rows holding every nibble pair, and again on random rows.
    scales.view(-1)[:7] = extremes
    scales.view(-1)[20:27] = extremes
    tensors["experts.blocks"] = blocks
    tensors["experts.scales"] = scales
    for label, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16),
                         ("f32", torch.float32)):
        tensors[f"experts.{label}"] = convert_moe_packed_tensors(
            blocks, scales, dtype=dtype).contiguous()

    blocks = torch.randint(0, 256, (2, 3, 2, 5, 16), generator=gen,
                           dtype=torch.uint8)
    scales = torch.randint(110, 140, (2, 3, 2, 5), generator=gen,
                           dtype=torch.uint8)
    tensors["rank5.blocks"] = blocks
    tensors["rank5.scales"] = scales
    tensors["rank5.bf16"] = convert_moe_packed_tensors(blocks, scales)

    blocks = torch.arange(32, dtype=torch.uint8).view(1, 2, 1, 16) * 8
    scales = torch.full((1, 2, 1), 255, dtype=torch.uint8)
    tensors["scale255.blocks"] = blocks
    tensors["scale255.scales"] = scales
    tensors["scale255.bf16"] = convert_moe_packed_tensors(blocks, scales)
    save_file(tensors, os.path.join(out, "mxfp4.safetensors"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "fixtures", "golden",
        "rope_mxfp4"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    yarn_fixtures(args.out)
    mxfp4_fixtures(args.out)


if __name__ == "__main__":
    main()
