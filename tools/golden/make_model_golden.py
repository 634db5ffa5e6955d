#!/usr/bin/env python3
"""Generate golden fixtures for the loraplex model loader and forward pass.

What it produces
----------------
One directory per case under ``tests/fixtures/golden/<case>/`` (or ``--out``):

* the Hugging Face ``save_pretrained`` output of a tiny, randomly initialised
  Llama-family checkpoint: ``config.json`` plus either ``model.safetensors``
  or sharded ``model-XXXXX-of-YYYYY.safetensors`` files with
  ``model.safetensors.index.json``;
* ``golden.safetensors`` with

  - ``input_ids``   int64   [B, T]  right-padded token ids, pad positions hold 0
  - ``lengths``     int64   [B]     number of valid tokens in each row
  - ``logits``      float32 [B, T, V]  HF transformers logits computed in fp32;
    positions ``t >= lengths[b]`` are exactly 0
  - ``logits_bf16`` float32 [B, T, V]  (``llama_bf16`` only) logits of the HF
    model run in bfloat16, cast to fp32, padded positions zeroed.

Cases cover grouped-query / multi-query attention, tied embeddings, an
explicit ``head_dim``, q/k/v/o and MLP biases, ``llama3`` and ``linear`` RoPE
scaling, Qwen2 (q/k/v bias) with a sharded checkpoint, Mistral with a sliding
window shorter than the sequence, and a bfloat16 checkpoint. The
mixture-of-experts cases (``moe_cases``) also assert that no valid token's
router nearly ties between its k-th and (k+1)-th expert (``ROUTER_MARGIN``).

Why
---
The C++ side loads these checkpoints with its own safetensors/config parsing
and runs its own forward pass. HF transformers (eager attention, i.e. the
plain math path) is an independent reference: the C++ logits must match
``logits`` for every valid position. Weights are re-randomised with a large
scale so that logits are far from uniform and small mistakes (a wrong RoPE
variant, a missing bias, a transposed projection) show up clearly.

Everything is deterministic (fixed seeds); the script also reloads each saved
checkpoint with ``from_pretrained`` and checks that it reproduces the stored
logits, and that padded and unpadded evaluation agree on valid positions.

How to regenerate
-----------------
From the repository root::

    python3 -m venv v && v/bin/pip install -r tools/golden/requirements.txt && v/bin/python tools/golden/make_model_golden.py

Outputs can differ in the last bits across torch/transformers versions or
CPU types; the versions used are pinned in ``tools/golden/requirements.txt``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
from pathlib import Path

import torch
import transformers
from packaging.version import Version
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

# The families added later are imported by name, so an older transformers
# still generates the cases it knows.
FAMILY_CLASSES = {
    name: getattr(transformers, name, None)
    for name in (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        "Olmo2Config",
        "Olmo2ForCausalLM",
        "Olmo3Config",
        "Olmo3ForCausalLM",
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        "Phi3Config",
        "Phi3ForCausalLM",
        "Gemma3Config",
        "Gemma3ForConditionalGeneration",
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        "GptOssConfig",
        "GptOssForCausalLM",
    )
}

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "golden"

B, T = 3, 7
LENGTHS = [7, 4, 1]

TF_V5 = Version(transformers.__version__) >= Version("5.0.0")
# transformers >= 4.56 takes ``dtype=``; older versions take ``torch_dtype=``.
DTYPE_KW = "dtype" if Version(transformers.__version__) >= Version("4.56.0") else "torch_dtype"

COMMON = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=128,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
)


def rope_kwargs(theta: float, scaling: dict | None) -> dict:
    """RoPE settings in the form the installed transformers expects."""
    if TF_V5:
        params = {"rope_type": "default", "rope_theta": theta}
        if scaling is not None:
            params = dict(scaling, rope_theta=theta)
        return {"rope_parameters": params}
    kw = {"rope_theta": theta}
    if scaling is not None:
        kw["rope_scaling"] = dict(scaling, type=scaling["rope_type"])
    return kw


def rope_theta(config) -> float:
    if TF_V5:
        return float(config.rope_parameters["rope_theta"])
    return float(config.rope_theta)


def make_cases() -> list[dict]:
    return [
        dict(
            name="llama_gqa",
            model_cls=LlamaForCausalLM,
            config=LlamaConfig(
                **COMMON,
                num_key_value_heads=2,
                tie_word_embeddings=False,
                **rope_kwargs(10000.0, None),
            ),
            seed=1001,
        ),
        dict(
            name="llama_tied_llama3",
            model_cls=LlamaForCausalLM,
            config=LlamaConfig(
                **COMMON,
                num_key_value_heads=2,
                tie_word_embeddings=True,
                attention_bias=True,
                mlp_bias=True,
                head_dim=16,
                **rope_kwargs(
                    500000.0,
                    {
                        "rope_type": "llama3",
                        "factor": 8.0,
                        "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 16,
                    },
                ),
            ),
            seed=1002,
            check_rope=True,
        ),
        dict(
            name="llama_linear_mqa",
            model_cls=LlamaForCausalLM,
            config=LlamaConfig(
                **COMMON,
                num_key_value_heads=1,
                tie_word_embeddings=False,
                **rope_kwargs(10000.0, {"rope_type": "linear", "factor": 2.0}),
            ),
            seed=1003,
            check_rope=True,
        ),
        dict(
            name="qwen2_bias_sharded",
            model_cls=Qwen2ForCausalLM,
            config=Qwen2Config(
                **COMMON,
                num_key_value_heads=2,
                tie_word_embeddings=False,
                **rope_kwargs(10000.0, None),
            ),
            seed=1004,
            max_shard_size="20KB",
        ),
        dict(
            name="mistral_window",
            model_cls=MistralForCausalLM,
            config=MistralConfig(
                **COMMON,
                num_key_value_heads=2,
                tie_word_embeddings=False,
                sliding_window=4,
                **rope_kwargs(10000.0, None),
            ),
            seed=1005,
            check_window=True,
        ),
        dict(
            name="llama_bf16",
            model_cls=LlamaForCausalLM,
            config=LlamaConfig(
                **COMMON,
                num_key_value_heads=2,
                tie_word_embeddings=False,
                **rope_kwargs(10000.0, None),
            ),
            seed=1006,
            bf16=True,
        ),
    ] + family_cases() + multimodal_cases() + moe_cases()


def family_cases() -> list[dict]:
    """The families of model_families.cc beyond llama, qwen2 and mistral."""
    if not TF_V5 or any(FAMILY_CLASSES[n] is None for n in ("Qwen3Config", "Olmo3Config", "Gemma3TextConfig", "Phi3Config")):
        print("transformers too old for qwen3/olmo2/olmo3/gemma3_text: skipped")
        return []
    c = FAMILY_CLASSES
    # Token ids inside the tiny vocabulary (the families' defaults are not).
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    three = dict(COMMON, num_hidden_layers=3)
    return [
        dict(
            # Per-head q/k norms, explicit head_dim (16 != 32 / 4), tied.
            name="qwen3_tied",
            model_cls=c["Qwen3ForCausalLM"],
            config=c["Qwen3Config"](
                **COMMON,
                num_key_value_heads=2,
                head_dim=16,
                tie_word_embeddings=True,
                **rope_kwargs(1000000.0, None),
                **ids,
            ),
            seed=1011,
        ),
        dict(
            # Untied, with q/k/v/o biases (attention_bias).
            name="qwen3_bias",
            model_cls=c["Qwen3ForCausalLM"],
            config=c["Qwen3Config"](
                **COMMON,
                num_key_value_heads=1,
                tie_word_embeddings=False,
                attention_bias=True,
                **rope_kwargs(10000.0, None),
                **ids,
            ),
            seed=1012,
        ),
        dict(
            # Post-norm residuals, q/k norms over the whole projection.
            name="olmo2_post_norm",
            model_cls=c["Olmo2ForCausalLM"],
            config=c["Olmo2Config"](
                **COMMON,
                num_key_value_heads=2,
                tie_word_embeddings=False,
                **rope_kwargs(500000.0, None),
                **ids,
            ),
            seed=1013,
        ),
        dict(
            # OLMo 2's layout plus sliding-window layers (window 4 < T).
            name="olmo3_window",
            model_cls=c["Olmo3ForCausalLM"],
            config=c["Olmo3Config"](
                **three,
                num_key_value_heads=2,
                tie_word_embeddings=False,
                sliding_window=4,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0},
                },
                **ids,
            ),
            seed=1014,
            check_layer_types=True,
        ),
        dict(
            # Sandwich norms as (1 + w), scaled embeddings, GELU-tanh,
            # query_pre_attn_scalar, sliding and global layers with their own
            # RoPE bases.
            name="gemma3_text_window",
            model_cls=c["Gemma3ForCausalLM"],
            config=c["Gemma3TextConfig"](
                **three,
                num_key_value_heads=2,
                head_dim=16,
                tie_word_embeddings=True,
                sliding_window=4,
                query_pre_attn_scalar=24,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                rope_parameters={
                    "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                },
                **ids,
            ),
            seed=1015,
            check_layer_types=True,
        ),
        dict(
            name="qwen3_bf16",
            model_cls=c["Qwen3ForCausalLM"],
            config=c["Qwen3Config"](
                **COMMON,
                num_key_value_heads=2,
                tie_word_embeddings=False,
                **rope_kwargs(1000000.0, None),
                **ids,
            ),
            seed=1016,
            bf16=True,
        ),
        dict(
            # Fused qkv_proj / gate_up_proj, LongRoPE past an original
            # context of 4 positions (the 7-token row takes the long factors,
            # the others the short: per row, as each runs alone), 3/4 of
            # each head rotated.
            name="phi3_longrope",
            model_cls=c["Phi3ForCausalLM"],
            config=c["Phi3Config"](
                **dict(COMMON, hidden_size=64, intermediate_size=96),
                num_key_value_heads=2,
                tie_word_embeddings=False,
                original_max_position_embeddings=4,
                rope_parameters={
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.75,
                    "original_max_position_embeddings": 4,
                    "short_factor": [1.0, 1.3, 1.9, 2.6, 3.1, 4.0],
                    "long_factor": [1.5, 2.5, 4.5, 7.0, 11.0, 16.0],
                },
                **ids,
            ),
            seed=1018,
            per_row_rope=True,
        ),
        dict(
            # Fused projections, plain RoPE, tied, a window on every layer.
            name="phi3_tied",
            model_cls=c["Phi3ForCausalLM"],
            config=c["Phi3Config"](
                **COMMON,
                num_key_value_heads=4,
                tie_word_embeddings=True,
                sliding_window=4,
                **rope_kwargs(10000.0, None),
                **ids,
            ),
            seed=1019,
            check_window=True,
        ),
        dict(
            name="gemma3_text_bf16",
            model_cls=c["Gemma3ForCausalLM"],
            config=c["Gemma3TextConfig"](
                **three,
                num_key_value_heads=2,
                head_dim=16,
                tie_word_embeddings=True,
                sliding_window=4,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                **ids,
            ),
            seed=1017,
            bf16=True,
        ),
    ]


# A tiny SigLIP tower, so that the multimodal checkpoints really hold vision
# and projector weights; the image token ids sit inside the vocabulary.
TINY_VISION = dict(
    hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=8, patch_size=4
)
MM_TOKENS = dict(mm_tokens_per_image=4, boi_token_index=125, eoi_token_index=126, image_token_index=127)


def multimodal_cases() -> list[dict]:
    """Gemma3ForConditionalGeneration, whose text model loraplex trains."""
    c = FAMILY_CLASSES
    if not TF_V5 or c["Gemma3ForConditionalGeneration"] is None:
        return []
    text = dict(
        COMMON,
        num_hidden_layers=3,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return [
        dict(
            # Stored under the module paths of transformers 5
            # (model.language_model., model.vision_tower., lm_head untied),
            # with the config save_pretrained writes.
            name="gemma3_mm",
            model_cls=c["Gemma3ForConditionalGeneration"],
            config=c["Gemma3Config"](
                text_config=dict(
                    text,
                    tie_word_embeddings=False,
                    query_pre_attn_scalar=24,
                    rope_parameters={
                        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    },
                ),
                vision_config=TINY_VISION,
                tie_word_embeddings=False,
                **MM_TOKENS,
            ),
            seed=1020,
            mm_layout="module",
        ),
        dict(
            # As transformers 4.x wrote it (google/gemma-3-*-it):
            # language_model.model., vision_tower.vision_model., tied; a
            # config whose text_config leaves out Gemma3TextConfig's defaults
            # (query_pre_attn_scalar, RoPE bases) and uses the 4.x keys.
            name="gemma3_mm_v4",
            model_cls=c["Gemma3ForConditionalGeneration"],
            config=c["Gemma3Config"](
                text_config=dict(
                    text,
                    tie_word_embeddings=True,
                    rope_parameters={
                        "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    },
                ),
                vision_config=TINY_VISION,
                **MM_TOKENS,
            ),
            seed=1021,
            mm_layout="v4",
        ),
    ]


def save_multimodal(case: dict, model, case_dir: Path) -> None:
    """Writes a Gemma3ForConditionalGeneration checkpoint in the case's layout."""
    if case["mm_layout"] == "module":
        model.config.save_pretrained(str(case_dir))
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        assert "lm_head.weight" in state and "model.language_model.embed_tokens.weight" in state
        save_file(state, str(case_dir / "model.safetensors"), metadata={"format": "pt"})
        return
    state = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight":
            continue  # Tied.
        for old, new in (
            ("model.language_model.", "language_model.model."),
            ("model.vision_tower.", "vision_tower.vision_model."),
            ("model.multi_modal_projector.", "multi_modal_projector."),
        ):
            if k.startswith(old):
                k = new + k[len(old) :]
                break
        else:
            raise AssertionError(k)
        state[k] = v.contiguous()
    save_file(state, str(case_dir / "model.safetensors"), metadata={"format": "pt"})
    t = model.config.text_config
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text",
            "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size,
            "num_hidden_layers": t.num_hidden_layers,
            "num_attention_heads": t.num_attention_heads,
            "num_key_value_heads": t.num_key_value_heads,
            "head_dim": t.head_dim,
            "vocab_size": t.vocab_size,
            "max_position_embeddings": t.max_position_embeddings,
            "rms_norm_eps": t.rms_norm_eps,
            "sliding_window": t.sliding_window,
            "sliding_window_pattern": 2,
            "rope_scaling": {"factor": 2.0, "rope_type": "linear"},
        },
        "vision_config": {"model_type": "siglip_vision_model", **TINY_VISION},
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
        "pad_token_id": 0,
        **MM_TOKENS,
        "torch_dtype": "float32",
        "transformers_version": "4.50.0.dev0",
    }
    (case_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# Mixture-of-experts cases: 8 experts of width 16, 2 per token.
MOE = dict(COMMON, intermediate_size=48, num_key_value_heads=2, head_dim=8)
QWEN3_MOE = dict(MOE, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)
# Top-k selection flips between implementations (fp32 vs fp64, another
# summation order) when the k-th and (k+1)-th router scores nearly tie: every
# valid token of every golden input keeps them at least this far apart, on
# the score the router ranks by (Qwen3-MoE: the fp32 softmax; gpt-oss: the
# logits).
ROUTER_MARGIN = 1e-3


def moe_cases() -> list[dict]:
    """Sparse mixture-of-experts families."""
    c = FAMILY_CLASSES
    if not TF_V5 or c["Qwen3MoeConfig"] is None:
        return []
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return [
        dict(
            # Layers 0 and 2 sparse, layer 1 a dense MLP (mlp_only_layers),
            # top-k weights renormalised; save_pretrained writes one tensor
            # per expert and projection (mlp.experts.{e}.gate_proj.weight).
            name="qwen3_moe",
            model_cls=c["Qwen3MoeForCausalLM"],
            config=c["Qwen3MoeConfig"](
                **dict(QWEN3_MOE, num_hidden_layers=3),
                decoder_sparse_step=1,
                mlp_only_layers=[1],
                norm_topk_prob=True,
                tie_word_embeddings=False,
                **rope_kwargs(1000000.0, None),
                **ids,
            ),
            # Seeds chosen for a wide router margin (0.012, 0.0074, 0.012)
            # with every expert picked by some valid token.
            seed=1132,
            moe=True,
        ),
        dict(
            # decoder_sparse_step 2 (layers 1 and 3 sparse), raw softmax
            # top-k weights, tied; the experts stored as transformers 5 holds
            # them: mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I].
            name="qwen3_moe_fused",
            model_cls=c["Qwen3MoeForCausalLM"],
            config=c["Qwen3MoeConfig"](
                **dict(QWEN3_MOE, num_hidden_layers=4),
                decoder_sparse_step=2,
                norm_topk_prob=False,
                tie_word_embeddings=True,
                **rope_kwargs(1000000.0, None),
                **ids,
            ),
            seed=1135,
            moe=True,
            expert_layout="fused",
        ),
        dict(
            name="qwen3_moe_bf16",
            model_cls=c["Qwen3MoeForCausalLM"],
            config=c["Qwen3MoeConfig"](
                **QWEN3_MOE,
                decoder_sparse_step=1,
                norm_topk_prob=True,
                tie_word_embeddings=False,
                **rope_kwargs(1000000.0, None),
                **ids,
            ),
            seed=1133,
            moe=True,
            bf16=True,
        ),
    ] + gpt_oss_cases()


def gpt_oss_cases() -> list[dict]:
    """gpt-oss: sinks, alternating sliding/full layers, YaRN, clamped SwiGLU
    experts with biases, a router with a bias."""
    c = FAMILY_CLASSES
    if c["GptOssConfig"] is None:
        return []
    config = dict(
        hidden_size=32,
        intermediate_size=16,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=128,
        # 16 / original_max_position_embeddings 4 is YaRN's factor 4 (a
        # different ratio only makes transformers warn).
        max_position_embeddings=16,
        rms_norm_eps=1e-5,
        num_local_experts=8,
        num_experts_per_tok=2,
        sliding_window=4,
        attention_bias=True,
        swiglu_limit=1.0,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 4,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return [
        dict(
            # save_pretrained writes the experts as transformers holds them:
            # gate_up_proj [E, H, 2I] (gate and up interleaved), down_proj
            # [E, I, H] and their biases.
            name="gpt_oss",
            model_cls=c["GptOssForCausalLM"],
            config=c["GptOssConfig"](**config),
            seed=1141,
            moe=True,
            sinks_std=0.5,
            check_rope=True,
            check_layer_types=True,
            check_clamp=True,
        ),
        dict(
            # A released checkpoint's layout: the experts in MXFP4
            # (gate_up_proj_blocks [E, 2I, H/32, 16] and _scales [E, 2I,
            # H/32], down_proj likewise), quantization_config
            # {"quant_method": "mxfp4"}; the weights are exactly
            # representable, so the fp32 logits are those of the dense model.
            name="gpt_oss_mxfp4",
            model_cls=c["GptOssForCausalLM"],
            config=c["GptOssConfig"](**dict(config, hidden_size=64, intermediate_size=64, swiglu_limit=7.0)),
            seed=1147,
            moe=True,
            sinks_std=0.5,
            mxfp4=True,
        ),
    ]


# The e8m0 exponents of the MXFP4 golden's blocks: 2^-6 .. 2^-3 times FP4
# values up to 6, weights of the scale build_model draws.
MXFP4_EXPONENTS = (121, 122, 123, 124)
# transformers' Mxfp4Config for the released gpt-oss checkpoints.
MXFP4_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


@torch.no_grad()
def set_mxfp4_experts(model, seed: int) -> dict[str, torch.Tensor]:
    """Draws random MXFP4 blocks and scales for every expert weight, sets the
    model's dense weights to their dequantization (transformers' own
    convert_moe_packed_tensors) and returns the packed tensors by checkpoint
    name."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    g = torch.Generator().manual_seed(seed)
    packed = {}
    for name, p in model.named_parameters():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            continue
        e, fan_in, fan_out = p.shape  # transformers holds [E, in, out].
        assert fan_in % 32 == 0, (name, p.shape)
        blocks = torch.randint(0, 256, (e, fan_out, fan_in // 32, 16), generator=g, dtype=torch.uint8)
        exponents = torch.tensor(MXFP4_EXPONENTS, dtype=torch.uint8)
        scales = exponents[torch.randint(0, len(MXFP4_EXPONENTS), (e, fan_out, fan_in // 32), generator=g)]
        dense = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
        assert dense.shape == p.shape, (dense.shape, p.shape)
        p.copy_(dense)
        packed[f"{name}_blocks"] = blocks
        packed[f"{name}_scales"] = scales
    assert packed
    return packed


def save_mxfp4_checkpoint(model, packed: dict[str, torch.Tensor], case_dir: Path) -> None:
    """save_pretrained's checkpoint with the dense expert weights replaced by
    their MXFP4 blocks and scales, and the released checkpoints'
    quantization_config."""
    model.save_pretrained(str(case_dir), safe_serialization=True)
    path = case_dir / "model.safetensors"
    with safe_open(str(path), framework="pt") as fh:
        state = {k: fh.get_tensor(k) for k in fh.keys()}
    for name in packed:
        dense = name.removesuffix("_blocks").removesuffix("_scales")
        state.pop(dense, None)
    state.update(packed)
    save_file(dict(sorted(state.items())), str(path), metadata={"format": "pt"})
    config_path = case_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = {"modules_to_not_convert": MXFP4_NOT_CONVERTED, "quant_method": "mxfp4"}
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def router_choices(model, ids, mask) -> tuple[float, list[torch.Tensor]]:
    """Runs ``model`` and returns the smallest margin between the k-th and
    (k+1)-th router score over the valid tokens of every sparse layer, and
    each sparse layer's chosen experts [valid tokens, k] (sorted)."""
    logits = []
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    assert routers, "no router"
    hooks = [m.register_forward_hook(lambda m, i, o: logits.append((m, o[0].detach()))) for m in routers]
    try:
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    valid = mask.reshape(-1).bool()
    margin, chosen = float("inf"), []
    for router, lg in logits:
        lg = lg.reshape(-1, lg.shape[-1])[valid]
        # gpt-oss ranks the logits; Qwen3-MoE their float32 softmax.
        # (In float32 at least, as transformers' softmax; float64 models
        # of make_family_step_golden.py keep float64.)
        score = lg if type(router).__name__.startswith("GptOss") else lg.softmax(-1, dtype=torch.promote_types(lg.dtype, torch.float32))
        top = score.sort(-1, descending=True)
        k = router.top_k
        margin = min(margin, (top.values[:, k - 1] - top.values[:, k]).min().item())
        chosen.append(top.indices[:, :k].sort(-1).values)
    return margin, chosen


def check_routing(case: dict, model, ids, mask) -> list[torch.Tensor]:
    """Asserts the router margin, prints it and the experts' use."""
    margin, chosen = router_choices(model, ids, mask)
    assert margin > ROUTER_MARGIN, f"router near-tie: margin {margin:.2e} <= {ROUTER_MARGIN}"
    used = torch.bincount(torch.cat([c.flatten() for c in chosen]), minlength=8).tolist()
    assert min(used) > 0, f"an expert no valid token picks: {used}"
    print(f"  {len(chosen)} sparse layers; min router margin {margin:.4f}; picks per expert {used}")
    return chosen


def save_fused_experts(model, case_dir: Path) -> None:
    """The state_dict as transformers 5 holds it (stacked experts), tied
    lm_head left out, in place of the per-expert tensors save_pretrained
    writes beside its config."""
    model.save_pretrained(str(case_dir), safe_serialization=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]
    save_file(state, str(case_dir / "model.safetensors"), metadata={"format": "pt"})


def check_expert_names(case: dict, cfg, names: list[str]) -> None:
    """The experts are stored per expert or stacked, as the case says."""
    if cfg.model_type == "gpt_oss":
        e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
        want = {"gate_up_proj": [e, h, 2 * i], "gate_up_proj_bias": [e, 2 * i], "down_proj": [e, i, h], "down_proj_bias": [e, h]}
        if case.get("mxfp4"):
            for p in ("gate_up_proj", "down_proj"):
                del want[p]
                want[p + "_blocks"] = want[p + "_scales"] = None
            assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in names)
        for layer in range(cfg.num_hidden_layers):
            for p in want:
                assert f"model.layers.{layer}.mlp.experts.{p}" in names, p
            assert f"model.layers.{layer}.mlp.router.bias" in names and f"model.layers.{layer}.self_attn.sinks" in names
        print(f"  experts stored stacked: {want}")
        return
    sparse = [
        i
        for i in range(cfg.num_hidden_layers)
        if i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0
    ]
    for i in range(cfg.num_hidden_layers):
        mlp = f"model.layers.{i}.mlp."
        if i not in sparse:
            assert f"{mlp}gate_proj.weight" in names, f"layer {i} is not dense"
        elif case.get("expert_layout") == "fused":
            assert f"{mlp}experts.gate_up_proj" in names and f"{mlp}experts.down_proj" in names
            assert f"{mlp}experts.0.gate_proj.weight" not in names
        else:
            want = [f"{mlp}experts.{e}.{p}_proj.weight" for e in range(cfg.num_experts) for p in ("gate", "up", "down")]
            assert all(n in names for n in want) and f"{mlp}experts.gate_up_proj" not in names
        if i in sparse:
            assert f"{mlp}gate.weight" in names
    print(f"  sparse layers {sparse}; experts stored {case.get('expert_layout', 'per expert')}")


def build_model(case: dict) -> torch.nn.Module:
    config = copy.deepcopy(case["config"])
    config._attn_implementation = "eager"
    if case.get("moe"):
        config._experts_implementation = "eager"  # The plain loop over experts.
    torch.manual_seed(case["seed"])
    model = case["model_cls"](config)
    # Re-randomise with a large scale so logits are far from uniform.
    # named_parameters() yields a tied lm_head/embed_tokens tensor only once.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
            if name.endswith(".sinks") and "sinks_std" in case:
                p.normal_(0.0, case["sinks_std"])
    model.eval()
    return model


def make_inputs(seed: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, T), generator=g, dtype=torch.int64)
    lengths = torch.tensor(LENGTHS, dtype=torch.int64)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).to(torch.int64)
    ids = ids * mask  # pad positions hold 0
    return ids, lengths, mask


@torch.no_grad()
def forward(model, ids, mask) -> torch.Tensor:
    out = model(input_ids=ids, attention_mask=mask, use_cache=False)
    logits = out.logits.to(torch.float32)
    return logits * mask[:, :, None].to(torch.float32)  # padded positions -> exactly 0


@torch.no_grad()
def forward_unpadded(model, ids, lengths) -> torch.Tensor:
    """Each row run on its own without padding, zero-filled to [B, T, V]."""
    rows = []
    for b in range(B):
        n = int(lengths[b])
        out = model(input_ids=ids[b : b + 1, :n], use_cache=False).logits.to(torch.float32)[0]
        row = torch.zeros(T, out.shape[-1], dtype=torch.float32)
        row[:n] = out
        rows.append(row)
    return torch.stack(rows)


def saved_tensor_names(case_dir: Path) -> list[str]:
    names = []
    for f in sorted(case_dir.glob("*.safetensors")):
        if f.name == "golden.safetensors":
            continue
        with safe_open(str(f), framework="pt") as fh:
            names.extend(fh.keys())
    return names


def saved_tensor_dtypes(case_dir: Path) -> set[str]:
    dtypes = set()
    for f in sorted(case_dir.glob("*.safetensors")):
        if f.name == "golden.safetensors":
            continue
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():
                dtypes.add(str(fh.get_slice(k).get_dtype()))
    return dtypes


def reload(case_dir: Path, dtype: torch.dtype, **kwargs):
    m = AutoModelForCausalLM.from_pretrained(
        str(case_dir), attn_implementation="eager", **{DTYPE_KW: dtype}, **kwargs
    )
    (m[0] if isinstance(m, tuple) else m).eval()
    return m


def assert_close(name: str, a: torch.Tensor, b: torch.Tensor, atol: float) -> float:
    diff = (a - b).abs().max().item()
    assert diff <= atol, f"{name}: max abs diff {diff} > {atol}"
    return diff


def run_case(case: dict, out_dir: Path) -> None:
    name = case["name"]
    case_dir = out_dir / name
    if case_dir.exists():
        shutil.rmtree(case_dir)
    case_dir.mkdir(parents=True)

    model = build_model(case)
    packed = set_mxfp4_experts(model, case["seed"] + 3) if case.get("mxfp4") else None
    cfg = model.config
    mm = "mm_layout" in case
    if mm:
        cfg = cfg.text_config
    ids, lengths, mask = make_inputs(case["seed"] + 7, cfg.vocab_size)
    if mm:
        assert not any(int(i) in MM_TOKENS.values() for i in ids.flatten()), "an image token among the inputs"
    tensors = {"input_ids": ids, "lengths": lengths}

    if case.get("bf16"):
        # Round the weights to bf16 and keep an fp32 copy holding exactly those values.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
        model_f32 = model
        tensors["logits"] = forward(model_f32, ids, mask).contiguous()
        # Cast parameters only. model.to(torch.bfloat16) would also round the
        # RoPE inv_freq buffers to bf16, which from_pretrained(dtype=bfloat16)
        # does not do (it keeps them fp32); match what a loaded bf16 model runs.
        model = copy.deepcopy(model_f32)
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
        for bname, buf in model.named_buffers():
            assert buf.dtype == torch.float32, f"{bname} is {buf.dtype}"
        tensors["logits_bf16"] = forward(model, ids, mask).contiguous()
        if case.get("moe"):
            # bf16 router logits tie more easily; the bf16 run must pick the
            # fp32 run's experts, by a margin too.
            chosen = check_routing(case, model_f32, ids, mask)
            assert all(torch.equal(a, b) for a, b in zip(chosen, check_routing(case, model, ids, mask)))
    else:
        model_f32 = model
        tensors["logits"] = forward(model, ids, mask).contiguous()
        if case.get("moe"):
            check_routing(case, model, ids, mask)

    unpadded = forward_unpadded(model_f32, ids, lengths)
    if case.get("per_row_rope"):
        # LongRoPE picks its factors by the length a forward pass reaches,
        # which padding changes: the reference is each row run alone (the
        # padded batch takes the long factors for every row, and must differ).
        pad_diff = (tensors["logits"] - unpadded).abs().max().item()
        assert pad_diff > 1e-3, f"long and short factors gave the same logits ({pad_diff})"
        tensors["logits"] = unpadded.contiguous()
    else:
        # Padding must not change valid positions (checks the attention mask path).
        pad_diff = assert_close(f"{name} padded vs unpadded", tensors["logits"], unpadded, 1e-5)

    # The window must actually matter for the long row.
    if case.get("check_window"):
        assert cfg.sliding_window is not None and cfg.sliding_window < T
        nowin_cfg = copy.deepcopy(cfg)
        nowin_cfg.sliding_window = None
        nowin = case["model_cls"](nowin_cfg)
        nowin.load_state_dict(model.state_dict())
        nowin.eval()
        nowin_logits = forward(nowin, ids, mask)
        w = cfg.sliding_window
        # Positions t < w see the same keys with and without the window.
        assert torch.equal(nowin_logits[:, :w], tensors["logits"][:, :w]), "window changed early positions"
        d = (nowin_logits[0, w:] - tensors["logits"][0, w:]).abs().max().item()
        assert d > 1e-3, f"sliding_window={w} had no effect on logits (max diff {d})"
        print(f"  sliding window {w} takes effect: max |diff| vs no window at t>={w}: {d:.4f}")

    # The sliding-window layers must matter for the long row.
    if case.get("check_layer_types"):
        full_cfg = copy.deepcopy(cfg)
        full_cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
        full = case["model_cls"](full_cfg)
        full.load_state_dict(model.state_dict())
        full.eval()
        w = cfg.sliding_window
        d = (forward(full, ids, mask)[0, w:] - tensors["logits"][0, w:]).abs().max().item()
        assert d > 1e-3, f"sliding layers had no effect on logits (max diff {d})"
        print(f"  sliding layers take effect: max |diff| vs all full at t>={w}: {d:.4f}")

    # The SwiGLU clamp must bite on some entries.
    if case.get("check_clamp"):
        experts_cls = type(model.model.layers[0].mlp.experts)
        apply_gate, counts = experts_cls._apply_gate, [0, 0, 0]

        def counting_gate(self, gate_up):
            counts[0] += int((gate_up[..., ::2] > self.limit).sum())
            counts[1] += int((gate_up[..., 1::2].abs() > self.limit).sum())
            counts[2] += gate_up.numel() // 2
            return apply_gate(self, gate_up)

        experts_cls._apply_gate = counting_gate
        try:
            forward(model, ids, mask)
        finally:
            experts_cls._apply_gate = apply_gate
        loose_cfg = copy.deepcopy(cfg)
        loose_cfg.swiglu_limit = 1e9
        loose = case["model_cls"](loose_cfg)
        loose.load_state_dict(model.state_dict())
        loose.eval()
        d = (forward(loose, ids, mask) - tensors["logits"]).abs().max().item()
        assert counts[0] and counts[1] and d > 1e-3, (counts, d)
        print(
            f"  swiglu_limit {cfg.swiglu_limit} clamps {counts[0]} gate and {counts[1]} up entries of {counts[2]} "
            f"each (all routed tokens, padding too); max |diff| vs no clamp {d:.4f}"
        )

    # RoPE scaling must actually change the result at these short positions.
    if case.get("check_rope"):
        plain_cfg = copy.deepcopy(cfg)
        theta = rope_theta(cfg)
        for k, v in rope_kwargs(theta, None).items():
            setattr(plain_cfg, k, v)
        if not TF_V5:
            plain_cfg.rope_scaling = None
        plain = case["model_cls"](plain_cfg)
        plain.load_state_dict(model.state_dict())
        plain.eval()
        d = (forward(plain, ids, mask)[0, 1:] - tensors["logits"][0, 1:]).abs().max().item()
        assert d > 1e-3, f"RoPE scaling had no effect on logits (max diff {d})"
        print(f"  rope scaling takes effect: max |diff| vs unscaled rope: {d:.4f}")

    save_kwargs = {}
    if "max_shard_size" in case:
        save_kwargs["max_shard_size"] = case["max_shard_size"]
    if mm:
        save_multimodal(case, model, case_dir)
    elif case.get("expert_layout") == "fused":
        save_fused_experts(model, case_dir)
    elif packed is not None:
        save_mxfp4_checkpoint(model, packed, case_dir)
    else:
        model.save_pretrained(str(case_dir), safe_serialization=True, **save_kwargs)
    gen_cfg = case_dir / "generation_config.json"
    if gen_cfg.exists():
        gen_cfg.unlink()

    # No safetensors metadata: its key order is not stable between runs, and
    # leaving it out keeps regenerated files byte-identical.
    save_file(tensors, str(case_dir / "golden.safetensors"))

    # ---- checks on what was written ----
    names = saved_tensor_names(case_dir)
    assert len(names) == len(set(names)), "duplicate tensor names across shards"
    if mm:
        text = "model.language_model." if case["mm_layout"] == "module" else "language_model.model."
        assert f"{text}embed_tokens.weight" in names
        assert any("vision_tower." in n for n in names) and any("multi_modal_projector." in n for n in names)
        assert ("lm_head.weight" in names) == (case["mm_layout"] == "module")
    elif cfg.tie_word_embeddings:
        assert "lm_head.weight" not in names, "tied checkpoint must not contain lm_head.weight"
    else:
        assert "lm_head.weight" in names, "untied checkpoint must contain lm_head.weight"
    if not mm:
        assert "model.embed_tokens.weight" in names
    if case.get("moe"):
        check_expert_names(case, cfg, names)

    if "max_shard_size" in case:
        index = case_dir / "model.safetensors.index.json"
        assert index.exists(), "expected a sharded checkpoint with an index"
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        assert len(shards) >= 2, f"expected several shards, got {shards}"
        assert not (case_dir / "model.safetensors").exists()
        print(f"  {len(shards)} shards")
    else:
        assert (case_dir / "model.safetensors").exists()
        assert not (case_dir / "model.safetensors.index.json").exists()

    dtypes = saved_tensor_dtypes(case_dir)
    want = {"BF16" if case.get("bf16") else "F32"} | ({"U8"} if packed is not None else set())
    assert dtypes == want, f"stored dtypes {dtypes}, expected {want}"

    # Reload the saved checkpoint and reproduce the stored logits.
    if mm:
        # Every tensor of the layout is one transformers reads (vision too).
        re32, info = case["model_cls"].from_pretrained(
            str(case_dir), attn_implementation="eager", output_loading_info=True, **{DTYPE_KW: torch.float32}
        )
        re32.eval()
        assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        re_cfg = re32.config.text_config
        assert re_cfg.layer_types == cfg.layer_types and re_cfg.rope_parameters == cfg.rope_parameters, re_cfg
    elif packed is not None:
        # transformers' own MXFP4 loading, dequantized on the CPU.
        re32, info = reload(
            case_dir,
            torch.float32,
            experts_implementation="eager",
            output_loading_info=True,
            quantization_config=transformers.Mxfp4Config(dequantize=True),
        )
        assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
        for name, blocks in packed.items():
            if name.endswith("_blocks"):
                dense = re32.get_parameter(name.removesuffix("_blocks"))
                assert dense.dtype == torch.float32 and torch.equal(dense, model.get_parameter(name.removesuffix("_blocks")))
        print(f"  {len(packed) // 2} expert weights stored in MXFP4; reloaded with Mxfp4Config(dequantize=True)")
    elif case.get("moe"):
        re32, info = reload(case_dir, torch.float32, experts_implementation="eager", output_loading_info=True)
        assert not any(info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    else:
        re32 = reload(case_dir, torch.float32)
    run = forward_unpadded if case.get("per_row_rope") else forward
    d32 = assert_close(
        f"{name} reload fp32", run(re32, ids, lengths if case.get("per_row_rope") else mask), tensors["logits"], 1e-6
    )
    if case.get("bf16"):
        re16 = reload(case_dir, torch.bfloat16, **({"experts_implementation": "eager"} if case.get("moe") else {}))
        assert next(re16.parameters()).dtype == torch.bfloat16
        d16 = assert_close(f"{name} reload bf16", forward(re16, ids, mask), tensors["logits_bf16"], 1e-6)
        diff_bf = (tensors["logits_bf16"] - tensors["logits"]).abs().max().item()
        print(f"  reload bf16 max|diff| {d16:.2e}; bf16 vs fp32 logits max|diff| {diff_bf:.4f}")

    lg = tensors["logits"][0]
    print(
        f"  reload fp32 max|diff| {d32:.2e}; padded vs unpadded max|diff| {pad_diff:.2e}; "
        f"logit std {lg.std().item():.3f}, max softmax prob {lg.softmax(-1).max().item():.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    ap.add_argument("--only", nargs="*", help="generate only these cases")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    print(f"transformers {transformers.__version__}, torch {torch.__version__} -> {args.out}")
    for case in make_cases():
        if args.only and case["name"] not in args.only:
            continue
        print(f"[{case['name']}]")
        run_case(case, args.out)
    print("all cases written and verified")


if __name__ == "__main__":
    main()
