#!/usr/bin/env python3
"""Generate golden training steps for each model family beyond Llama's layout.

What it produces
----------------
Under ``tests/fixtures/golden/family_steps/`` (or ``--out``), for each base
of ``make_model_golden.py`` named in ``FAMILIES`` with its PEFT adapter
``peft/<base>_all_r4`` (``make_peft_golden.py``, LoRA on all seven
projections):

* ``cases.json``: three datums (token ids of 5, 8 and 11 tokens, a target
  token and a real weight per position, negative ones included), shared by
  every base, and per base the cross-entropy loss Σ -w·log p(target) summed
  over every token (Tinker's semantics) and each datum's target logprobs;
* ``<base>.safetensors``: ``grad.<peft name>``, d loss / d every LoRA matrix,
  and ``adamw.<peft name>``, the matrix after one ``torch.optim.AdamW`` step
  on that gradient (lr 0.01, weight decay 0.1, betas (0.9, 0.999), eps 1e-8).

Everything runs in float64 with transformers' own model classes and PEFT.
transformers rounds to float32 in two places even in a float64 model: its
eager attention's softmax and each family's RMSNorm upcast; both are replaced
by the same math in the input dtype (``fp64_reference.py``), so only the
rotary tables stay float32, as in loraplex.

How to regenerate
-----------------
From the repository root::

    python3 -m venv v && v/bin/pip install -r tools/golden/requirements.txt && v/bin/python tools/golden/make_family_step_golden.py

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
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRMSNorm
from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
from transformers.models.olmo3.modeling_olmo3 import Olmo3RMSNorm
from transformers.models.phi3.modeling_phi3 import Phi3RMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm, Qwen3MoeTopKRouter

from fp64_reference import ATTENTION, use_fp64_reference
from make_model_golden import ROUTER_MARGIN, router_choices

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN_ROOT = REPO_ROOT / "tests" / "fixtures" / "golden"
DEFAULT_OUT = GOLDEN_ROOT / "family_steps"
FAMILIES = ["qwen3_tied", "olmo2_post_norm", "olmo3_window", "gemma3_text_window", "phi3_tied", "qwen3_moe", "gpt_oss"]
# Mixture-of-experts bases run their experts in transformers' plain loop.
MOE = {"qwen3_moe", "gpt_oss"}
# The adapter each base trains (peft/<name>): <base>_all_r4 unless named
# here. Qwen3-MoE's all_r4 carries PEFT's rank_pattern for gate_up_proj,
# which loraplex refuses; its experts_r4 is rank 4 everywhere.
ADAPTERS = {"qwen3_moe": "qwen3_moe_experts_r4"}


def adapter_name(base: str) -> str:
    return ADAPTERS.get(base, f"{base}_all_r4")
DTYPE_KW = "dtype" if Version(transformers.__version__) >= Version("4.56.0") else "torch_dtype"
LENGTHS = [5, 8, 11]
ADAMW = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


use_fp64_reference(
    # GptOssRMSNorm's (w · x̂).to(dtype) is w · x̂ without the upcast too.
    weight_norms=(Qwen3RMSNorm, Olmo2RMSNorm, Olmo3RMSNorm, Phi3RMSNorm, Qwen3MoeRMSNorm, GptOssRMSNorm),
    one_plus_weight_norms=(Gemma3RMSNorm,),
)


def qwen3_moe_router_in_input_dtype(self, hidden_states):
    """Qwen3-MoE's router without its float32 softmax."""
    router_logits = torch.nn.functional.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)
    top, index = torch.topk(torch.softmax(router_logits, dim=-1), self.top_k, dim=-1)
    if self.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return router_logits, top, index


Qwen3MoeTopKRouter.forward = qwen3_moe_router_in_input_dtype


def load_policy(base: str):
    experts = {"experts_implementation": "eager"} if base in MOE else {}
    model = AutoModelForCausalLM.from_pretrained(
        str(GOLDEN_ROOT / base), attn_implementation=ATTENTION, **{DTYPE_KW: torch.float64}, **experts
    )
    model = PeftModel.from_pretrained(model, str(GOLDEN_ROOT / "peft" / adapter_name(base)), is_trainable=True)
    model = model.double()
    model.train()  # lora_dropout is 0: train mode only enables gradients.
    return model


def make_datums(vocab: int) -> list[dict]:
    g = torch.Generator().manual_seed(4242)
    return [
        dict(
            input_ids=torch.randint(0, vocab, (n,), generator=g).tolist(),
            target_tokens=torch.randint(0, vocab, (n,), generator=g).tolist(),
            weights=torch.randn(n, generator=g).tolist(),
        )
        for n in LENGTHS
    ]


def peft_name(param_name: str) -> str:
    """PEFT's saved name of a LoRA parameter (without the adapter name)."""
    return param_name.replace(".default.weight", ".weight")


@torch.no_grad()
def check_against_peft_golden(base: str, model) -> None:
    """The patched float64 model reproduces PEFT's float32 logits of
    make_peft_golden.py (unpatched transformers) on each unpadded row."""
    golden = load_file(str(GOLDEN_ROOT / "peft" / adapter_name(base) / "golden.safetensors"))
    worst = 0.0
    for row, n in enumerate(golden["lengths"].tolist()):
        ids = golden["input_ids"][row : row + 1, :n]
        logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0]
        worst = max(worst, (logits - golden["logits"][row, :n].double()).abs().max().item())
    assert worst < 1e-4, f"{base}: patched float64 model is {worst} from PEFT's float32 logits"
    print(f"[{base}] float64 model vs PEFT float32 golden: max|diff| {worst:.2e}")


def run_base(base: str, datums: list[dict], out: Path) -> dict:
    model = load_policy(base)
    check_against_peft_golden(base, model)
    lora = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert lora and all(".lora_" in n for n in lora), sorted(lora)
    total = torch.zeros((), dtype=torch.float64)
    logprobs = []
    for d in datums:
        ids = torch.tensor([d["input_ids"]])
        if base in MOE:
            with torch.no_grad():
                margin, _ = router_choices(model, ids, torch.ones_like(ids))
            assert margin > ROUTER_MARGIN, f"{base}: router near-tie in float64, margin {margin:.2e}"
            print(f"[{base}] {ids.shape[1]} tokens: min float64 router margin {margin:.4f}")
        logits = model(ids, attention_mask=torch.ones_like(ids)).logits[0]
        assert logits.dtype == torch.float64
        lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(d["target_tokens"])[:, None])[:, 0]
        logprobs.append(lp.detach().tolist())
        total = total + (-torch.tensor(d["weights"], dtype=torch.float64) * lp).sum()
    total.backward()
    tensors = {}
    for n, p in lora.items():
        tensors["grad." + peft_name(n)] = p.grad.detach().clone().contiguous()
    optimizer = torch.optim.AdamW(list(lora.values()), **ADAMW)
    optimizer.step()
    for n, p in lora.items():
        tensors["adamw." + peft_name(n)] = p.detach().clone().contiguous()
    save_file(tensors, str(out / f"{base}.safetensors"))
    print(f"[{base}] loss {total.item():.6f}, {len(lora)} LoRA matrices")
    return dict(loss=total.item(), logprobs=logprobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    vocab = min(json.loads((GOLDEN_ROOT / b / "config.json").read_text())["vocab_size"] for b in FAMILIES)
    datums = make_datums(vocab)
    cases = {base: run_base(base, datums, args.out) for base in FAMILIES}
    golden = dict(datums=datums, adamw=dict(ADAMW, betas=list(ADAMW["betas"])), bases=cases)
    (args.out / "cases.json").write_text(json.dumps(golden, indent=1) + "\n")
    print("written", args.out)


if __name__ == "__main__":
    main()
