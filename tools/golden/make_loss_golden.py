#!/usr/bin/env python3
"""Generate golden fixtures for loraplex's client-driven forward/backward.

What it produces
----------------
Under ``tests/fixtures/golden/losses/`` (or ``--out``), for the base
``llama_gqa`` (``make_model_golden.py``) with each of the PEFT adapters
``sampling/llama_gqa/adapter_a`` (r=4 on q/v), ``adapter_b`` (r=8,
rsLoRA, all seven projections) and ``adapter_c`` (r=4 on q/v and the LM
head) from ``make_sampling_golden.py``:

* ``cases.json``: three datums (model_input token ids of 5, 8 and 11
  tokens; ``target_tokens``; float ``weights``, negative ones included;
  sampler ``logprobs`` per adapter = an older policy's (that adapter with
  its B matrices scaled by 0.8) plus noise, so that the importance ratios fall on both sides of the clip
  bounds; ``advantages``
  of both signs), and for each case (a loss, its ``loss_fn_config``, an
  adapter):

  - ``loss``: the loss summed over every target token of every datum, with
    no normalisation (Tinker's semantics, docs/DESIGN.md §12);
  - ``logprobs``: per datum, log p of each target token (position i's
    logits predict target i; for the top-k cross-entropy case, k = 3
    targets per position, row-major);
  - ``grads``: the name of a safetensors file holding d loss / d every LoRA
    matrix, under PEFT's tensor names.

Everything is computed in float64 with transformers + PEFT (no dropout)
and torch autograd. transformers rounds to float32 in three places even in a
float64 model; two are replaced (its eager attention's softmax and RMSNorm's
upcast, by the same math in float64: ``fp64_reference.py``), so that
only the rotary tables are float32, as in loraplex (both compute them in
float32 and cast). That leaves differences of ~1e-8 from the tables' last
bits, far below what any mistake in a loss or its gradient would make. The losses are written here from
their definitions (tinker-docs "Loss Functions"), independently of the C++:

  cross_entropy        Σ -w·p
  importance_sampling  Σ -exp(p - q)·A
  ppo                  Σ -min(r·A, clip(r, lo, hi)·A)
  cispo                Σ -detach(clip(r, lo, hi))·A·p
  dro                  Σ -(A·p - ½·β·(p - q)²)

How to regenerate
-----------------
From the repository root::

    python3 -m venv v && v/bin/pip install -r tools/golden/requirements.txt && v/bin/python tools/golden/make_loss_golden.py

Versions are pinned in ``tools/golden/requirements.txt``.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
from pathlib import Path

import torch
import transformers
from packaging.version import Version
from peft import PeftModel
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from fp64_reference import ATTENTION, use_fp64_reference

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN_ROOT = REPO_ROOT / "tests" / "fixtures" / "golden"
DEFAULT_OUT = GOLDEN_ROOT / "losses"
BASE = "llama_gqa"
ADAPTERS = ["adapter_a", "adapter_b", "adapter_c"]
DTYPE_KW = "dtype" if Version(transformers.__version__) >= Version("4.56.0") else "torch_dtype"
LENGTHS = [5, 8, 11]
TOPK = 3

# (case name, loss_fn, loss_fn_config, targets per position)
CASES = [
    ("cross_entropy", "cross_entropy", {}, 1),
    ("cross_entropy_top3", "cross_entropy", {}, TOPK),
    ("importance_sampling", "importance_sampling", {}, 1),
    ("ppo", "ppo", {}, 1),
    ("ppo_narrow", "ppo", {"clip_low_threshold": 0.95, "clip_high_threshold": 1.05}, 1),
    ("cispo", "cispo", {}, 1),
    ("cispo_tight", "cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.1}, 1),
    ("dro", "dro", {"beta": 0.7}, 1),
]
DEFAULT_CLIPS = {"ppo": (0.8, 1.2), "cispo": (0.0, 4.0)}


use_fp64_reference(weight_norms=(LlamaRMSNorm,))


def load_policy(adapter: str):
    base = AutoModelForCausalLM.from_pretrained(
        str(GOLDEN_ROOT / BASE), attn_implementation=ATTENTION, **{DTYPE_KW: torch.float64}
    )
    model = PeftModel.from_pretrained(base, str(GOLDEN_ROOT / "sampling" / BASE / adapter), is_trainable=True)
    model = model.double()
    model.train()  # The adapters have lora_dropout 0: train mode only enables gradients.
    return model


def token_losses(loss_fn: str, config: dict, p, w, q, a):
    if loss_fn == "cross_entropy":
        return -w * p
    ratio = torch.exp(p - q)
    if loss_fn == "importance_sampling":
        return -ratio * a
    lo, hi = DEFAULT_CLIPS.get(loss_fn, (0.0, 0.0))
    lo = config.get("clip_low_threshold", lo)
    hi = config.get("clip_high_threshold", hi)
    if loss_fn == "ppo":
        return -torch.minimum(ratio * a, torch.clamp(ratio, lo, hi) * a)
    if loss_fn == "cispo":
        return -torch.clamp(ratio, lo, hi).detach() * a * p
    if loss_fn == "dro":
        return -(p * a - 0.5 * config["beta"] * (p - q) ** 2)
    raise ValueError(loss_fn)


def make_datums(vocab: int) -> list[dict]:
    g = torch.Generator().manual_seed(2112)
    datums = []
    for n in LENGTHS:
        datums.append(
            dict(
                input_ids=torch.randint(0, vocab, (n,), generator=g).tolist(),
                target_tokens=torch.randint(0, vocab, (n,), generator=g).tolist(),
                target_tokens_top3=torch.randint(0, vocab, (n, TOPK), generator=g).flatten().tolist(),
                weights=(torch.randn(n, generator=g)).tolist(),
                weights_top3=(torch.randn(n * TOPK, generator=g)).tolist(),
                # Noise added to the model's own logprobs (below).
                logprob_noise=(torch.randn(n, generator=g) * 0.4).tolist(),
                advantages=(torch.randn(n, generator=g)).tolist(),
            )
        )
    return datums


def target_logprobs(model, datum: dict, k: int):
    ids = torch.tensor([datum["input_ids"]])
    logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0]
    lp = torch.log_softmax(logits, -1)  # [n, vocab]
    if k == 1:
        targets = torch.tensor(datum["target_tokens"])
        return lp.gather(1, targets[:, None])[:, 0]
    targets = torch.tensor(datum["target_tokens_top3"]).reshape(-1, k)
    return lp.gather(1, targets).reshape(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config = json.loads((GOLDEN_ROOT / BASE / "config.json").read_text())
    datums = make_datums(config["vocab_size"])
    # The sampler's logprobs: those of an older policy (each adapter with its
    # B matrices scaled by 0.8) plus noise, so that the importance ratios
    # depend on the learner and are spread around 1.
    for adapter in ADAPTERS:
        sampler = load_policy(adapter)
        with torch.no_grad():
            for param_name, param in sampler.named_parameters():
                if "lora_B" in param_name:
                    param.mul_(0.8)
            for datum in datums:
                p = target_logprobs(sampler, datum, 1)
                noise = torch.tensor(datum["logprob_noise"], dtype=torch.float64)
                datum.setdefault("logprobs", {})[adapter] = (p + noise).tolist()
    out_datums = [
        dict(
            input_ids=d["input_ids"],
            target_tokens=d["target_tokens"],
            target_tokens_top3=d["target_tokens_top3"],
            weights=d["weights"],
            weights_top3=d["weights_top3"],
            logprobs=d["logprobs"],
            advantages=d["advantages"],
        )
        for d in datums
    ]
    cases = []
    for adapter in ADAPTERS:
        for name, loss_fn, loss_config, k in CASES:
            model = load_policy(adapter)
            total = torch.zeros((), dtype=torch.float64)
            logprobs = []
            ratios = []
            for datum in datums:
                p = target_logprobs(model, datum, k)
                logprobs.append(p.detach().tolist())
                if k == 1:
                    w = torch.tensor(datum["weights"], dtype=torch.float64)
                else:
                    w = torch.tensor(datum["weights_top3"], dtype=torch.float64)
                q = torch.tensor(datum["logprobs"][adapter], dtype=torch.float64)
                a = torch.tensor(datum["advantages"], dtype=torch.float64)
                if loss_fn != "cross_entropy":
                    ratios.extend(torch.exp(p - q).detach().tolist())
                total = total + token_losses(loss_fn, loss_config, p, w, q, a).sum()
            total.backward()
            grads = {}
            for param_name, param in model.named_parameters():
                if "lora_" in param_name:
                    key = param_name.replace(".default.weight", ".weight")
                    grads[key] = param.grad.detach().clone().contiguous()
            grads_file = f"{adapter}_{name}.safetensors"
            save_file(grads, str(args.out / grads_file))
            if loss_fn == "ppo" or (loss_fn == "cispo" and loss_config):
                lo, hi = DEFAULT_CLIPS[loss_fn]
                lo = loss_config.get("clip_low_threshold", lo)
                hi = loss_config.get("clip_high_threshold", hi)
                # Ratios on both sides of the bounds make the clip matter
                # (cispo's default bounds, 0 and 4, are met by no ratio here).
                below = sum(r < lo for r in ratios)
                above = sum(r > hi for r in ratios)
                inside = len(ratios) - below - above
                assert inside > 0 and (below > 0 or lo == 0.0) and above > 0, (name, below, inside, above)
            cases.append(
                dict(
                    adapter=adapter,
                    name=name,
                    loss_fn=loss_fn,
                    loss_fn_config=loss_config,
                    targets_per_position=k,
                    loss=total.item(),
                    logprobs=logprobs,
                    grads=grads_file,
                )
            )
            print(f"{adapter} {name}: loss {total.item():.6f}")
    golden = dict(
        base=BASE,
        versions=dict(torch=torch.__version__, transformers=transformers.__version__),
        datums=out_datums,
        cases=cases,
    )
    (args.out / "cases.json").write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main()
