#!/usr/bin/env python3
"""Generate golden fixtures for loraplex's sampler (prefill + KV-cache decode).

What it produces
----------------
Under ``tests/fixtures/golden/sampling/`` (or ``--out``):

* ``<base>/adapter_a`` and ``<base>/adapter_b``: two PEFT LoRA adapters for
  each of the base checkpoints in ``BASES`` (see ``make_model_golden.py``): ``adapter_a`` is r=4,
  alpha=8 on q_proj + v_proj; ``adapter_b`` is r=8, alpha=16, rsLoRA, on all
  seven projections. Their weights are seeded normal values large enough to
  change what the model generates.
* ``<base>/adapter_c``: r=4, alpha=8 on q_proj, v_proj and lm_head (LoRA on
  the LM head), seeded after the prompts are chosen for the others (the seed
  is advanced until its greedy choices have no near-ties).
* ``<base>/greedy.json``: for three prompts (token ids) and each of the
  weights ``base``, ``adapter_a``, ``adapter_b``, ``adapter_c``, transformers'
  ``generate(do_sample=False, max_new_tokens=10)`` on that prompt alone
  (unpadded, eager attention, fp32), with

  - ``tokens``: the generated ids (the EOS that ended a generation included);
  - ``stop``: ``"eos"`` or ``"length"``;
  - ``logprobs``: log_softmax of the fp32 logits at each generated token;
  - ``top_ids`` / ``top_logprobs``: the 5 most likely tokens at each step;
  - ``prompt_logprobs``: log p(prompt[t] | prompt[:t]) for t >= 1, from one
    forward pass over the prompt;
  - ``min_margin``: the smallest gap between the best and second-best logit
    over the generated steps (the script insists on >= 1e-3, so rounding
    differences between implementations cannot flip a greedy choice);
  - ``min_router_margin`` (mixture-of-experts bases): the smallest gap
    between a token's k-th and (k+1)-th router probability over the sparse
    layers of prompt + generation (>= 1e-4: no token is routed on a tie).

  On a mixture-of-experts base (``qwen3_moe``, ``gpt_oss``; transformers'
  eager experts)
  ``adapter_b`` adapts attention and the experts: PEFT ``target_parameters``
  ``mlp.experts.gate_up_proj`` and ``mlp.experts.down_proj`` in place of the
  MLP modules.

* ``stop_strings/``: a tiny Llama whose vocabulary is the byte-level BPE
  tokenizer ``tokenizers/qwen2_like`` (``tokenizer.json`` copied in), and
  ``stop_strings.json``: a prompt text, its ids, the greedy continuation
  without stop strings (24 tokens), and cases of stop strings picked from that
  continuation's text (inside one token, across token boundaries with the
  string overhanging a token at either end, two strings at once, and one that
  never occurs), each with the number of tokens transformers' ``generate``
  (``stop_strings=..., tokenizer=...``) returns.

Why
---
The C++ sampler runs its own KV cache (GQA, RoPE positions per row, sliding
window), co-batches rows of different adapters, and applies stop strings.
transformers + PEFT on the same checkpoint is the independent reference:
greedy tokens must be identical, logprobs within 1e-4, and a stop string must
end generation at the same token.

How to regenerate
-----------------
From the repository root::

    python3 -m venv v && v/bin/pip install -r tools/golden/requirements.txt && v/bin/python tools/golden/make_sampling_golden.py

Versions are pinned in ``tools/golden/requirements.txt``.
"""

from __future__ import annotations

import os
import sys

if os.environ.get("PYTHONHASHSEED") != "0":
    # Fix set iteration order (PEFT writes target_modules from a set).
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import json
import shutil
from pathlib import Path

import torch
import transformers
from packaging.version import Version
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN_ROOT = REPO_ROOT / "tests" / "fixtures" / "golden"
DEFAULT_OUT = GOLDEN_ROOT / "sampling"
BASES = [
    "llama_gqa",
    "qwen2_bias_sharded",
    "mistral_window",
    # The families of make_model_golden.py's family_cases().
    "qwen3_tied",
    "olmo2_post_norm",
    "olmo3_window",
    "gemma3_text_window",
    "phi3_tied",
    # Mixture of experts: the adapters' targets include the experts'
    # stacked parameters (PEFT target_parameters), decoded through the
    # KV cache and the routed experts.
    "qwen3_moe",
    # Attention sinks, YaRN, a router with a bias that softmaxes its top k,
    # and clamped SwiGLU experts with biases.
    "gpt_oss",
]
DTYPE_KW = "dtype" if Version(transformers.__version__) >= Version("4.56.0") else "torch_dtype"

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = [
    dict(name="adapter_a", r=4, lora_alpha=8, targets=["q_proj", "v_proj"], use_rslora=False, seed=7001, std=0.3),
    dict(name="adapter_b", r=8, lora_alpha=16, targets=ALL, use_rslora=True, seed=7002, std=0.15),
]
# LoRA on the LM head too: made after the prompts are chosen for the two
# above (so their cases do not move), re-seeded until its greedy choices
# have no near-ties on those prompts.
LM_HEAD_ADAPTER = dict(
    name="adapter_c", r=4, lora_alpha=8, targets=["q_proj", "v_proj", "lm_head"], use_rslora=False, seed=7003, std=0.3
)
MAX_NEW_TOKENS = 10
MOE_TYPES = {"qwen3_moe", "gpt_oss"}
# On a mixture-of-experts base an adapter that names the MLP projections
# adapts the experts' stacked parameters instead (PEFT target_parameters).
EXPERT_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
# The smallest gap between a token's k-th and (k+1)-th router probability
# over every sparse layer of every generation: rounding cannot reroute a
# token.
MIN_ROUTER_MARGIN = 1e-4
TOP = 5
MIN_MARGIN = 1e-3


def is_moe(base_dir: Path) -> bool:
    return json.loads((base_dir / "config.json").read_text())["model_type"] in MOE_TYPES


def load(path: Path):
    # Mixture-of-experts bases run transformers' plain loop over experts.
    experts = {"experts_implementation": "eager"} if is_moe(path) else {}
    m = AutoModelForCausalLM.from_pretrained(
        str(path), attn_implementation="eager", **{DTYPE_KW: torch.float32}, **experts
    )
    m.eval()
    return m


# Phi-3 fuses q/k/v and gate/up: a target on any part is one on the fused
# module.
FUSED_MODULE = dict(q_proj="qkv_proj", k_proj="qkv_proj", v_proj="qkv_proj", gate_proj="gate_up_proj", up_proj="gate_up_proj")


def targets_for(base_dir: Path, targets: list[str]) -> list[str]:
    if json.loads((base_dir / "config.json").read_text())["model_type"] != "phi3":
        return targets
    return sorted({FUSED_MODULE.get(t, t) for t in targets})


def make_adapter(base_dir: Path, spec: dict, out: Path) -> None:
    model = load(base_dir)
    targets, experts = targets_for(base_dir, spec["targets"]), {}
    if is_moe(base_dir) and "gate_proj" in targets:
        # Named as modules, PEFT would turn the MLP projections into expert
        # parameters of its own ranks (rank_pattern): name the experts'.
        targets = [t for t in targets if t not in ("gate_proj", "up_proj", "down_proj")]
        experts = dict(target_parameters=list(EXPERT_PARAMETERS))
    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=spec["r"],
        lora_alpha=spec["lora_alpha"],
        target_modules=targets,
        use_rslora=spec["use_rslora"],
        lora_dropout=0.0,
        bias="none",
        **experts,
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(spec["seed"])
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * spec["std"])
    peft_model.save_pretrained(str(out))
    readme = out / "README.md"
    if readme.exists():
        readme.unlink()
    config_path = out / "adapter_config.json"
    adapter_config = json.loads(config_path.read_text())
    adapter_config["base_model_name_or_path"] = base_dir.name
    config_path.write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")


def greedy(model, prompt: list[int], eos) -> dict:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=MAX_NEW_TOKENS,
            eos_token_id=eos,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        tokens = out.sequences[0, len(prompt):].tolist()
        logprobs, top_ids, top_logprobs, margins = [], [], [], []
        for step, logits in enumerate(out.logits):
            lp = torch.log_softmax(logits[0].float(), -1)
            logprobs.append(lp[tokens[step]].item())
            values, indices = lp.topk(TOP)
            top_ids.append(indices.tolist())
            top_logprobs.append(values.tolist())
            best = logits[0].float().topk(2).values
            margins.append((best[0] - best[1]).item())
        full = model(ids, attention_mask=torch.ones_like(ids)).logits[0].float()
        lp = torch.log_softmax(full, -1)
        prompt_logprobs = [lp[t - 1, prompt[t]].item() for t in range(1, len(prompt))]
    # Independent check of the cached decode: one plain forward over prompt +
    # tokens gives the same logprobs for the generated tokens.
    seq = torch.tensor([prompt + tokens])
    with torch.no_grad():
        plain = torch.log_softmax(model(seq, attention_mask=torch.ones_like(seq)).logits[0].float(), -1)
    for step, token in enumerate(tokens):
        assert abs(plain[len(prompt) + step - 1, token].item() - logprobs[step]) < 1e-5
    stop = "eos" if eos is not None and tokens and tokens[-1] == eos else "length"
    router_margin = None
    if getattr(model.config, "num_experts_per_tok", None):
        router_margin = min_router_margin(model, seq, model.config.num_experts_per_tok)
    return dict(
        prompt=prompt,
        tokens=tokens,
        stop=stop,
        logprobs=logprobs,
        top_ids=top_ids,
        top_logprobs=top_logprobs,
        prompt_logprobs=prompt_logprobs,
        min_margin=min(margins),
        **({} if router_margin is None else dict(min_router_margin=router_margin)),
    )


def min_router_margin(model, seq, top_k: int) -> float:
    """Smallest gap between the k-th and (k+1)-th router probability."""
    with torch.no_grad():
        out = model(seq, attention_mask=torch.ones_like(seq), output_router_logits=True)
    margin = float("inf")
    for logits in out.router_logits:
        if logits is None:
            continue
        probs = torch.softmax(logits.float(), -1).topk(top_k + 1, -1).values
        margin = min(margin, (probs[:, top_k - 1] - probs[:, top_k]).min().item())
    return margin


def no_near_ties(cases: list[dict]) -> bool:
    return all(c["min_margin"] >= MIN_MARGIN and c.get("min_router_margin", 1.0) >= MIN_ROUTER_MARGIN for c in cases)


def make_prompts(vocab: int, seed: int, max_positions: int) -> list[list[int]]:
    # Prompt + generation stays within max_position_embeddings (gpt_oss's
    # fixture has 16), which the sampler enforces.
    longest = max_positions - MAX_NEW_TOKENS
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (min(n, longest),), generator=generator).tolist() for n in (3, 6, 9)]


def run_base(base: str, out: Path) -> None:
    base_dir = GOLDEN_ROOT / base
    case_dir = out / base
    case_dir.mkdir(parents=True, exist_ok=True)
    for spec in ADAPTERS:
        make_adapter(base_dir, spec, case_dir / spec["name"])
    config = json.loads((base_dir / "config.json").read_text())
    eos = config.get("eos_token_id")
    weights = {"base": load(base_dir)}
    for spec in ADAPTERS:
        weights[spec["name"]] = PeftModel.from_pretrained(load(base_dir), str(case_dir / spec["name"])).eval()
    # Prompts whose greedy choices are never near-ties under any weights.
    for seed in range(100, 200):
        prompts = make_prompts(config["vocab_size"], seed, config["max_position_embeddings"])
        cases = []
        for name, model in weights.items():
            for prompt in prompts:
                case = greedy(model, prompt, eos)
                case["weights"] = name
                cases.append(case)
        if no_near_ties(cases):
            break
    else:
        raise SystemExit(f"{base}: no prompt set without near-ties")
    for attempt in range(50):
        spec = dict(LM_HEAD_ADAPTER, seed=LM_HEAD_ADAPTER["seed"] + 10 * attempt)
        make_adapter(base_dir, spec, case_dir / spec["name"])
        model = PeftModel.from_pretrained(load(base_dir), str(case_dir / spec["name"])).eval()
        lm_head_cases = [dict(greedy(model, prompt, eos), weights=spec["name"]) for prompt in prompts]
        if no_near_ties(lm_head_cases):
            break
    else:
        raise SystemExit(f"{base}: no {LM_HEAD_ADAPTER['name']} seed without near-ties")
    cases += lm_head_cases
    distinct = {tuple(c["tokens"]) for c in cases}
    assert len(distinct) >= 6, f"{base}: the adapters barely change the generations"
    body = dict(base=base, eos_token_id=eos, max_new_tokens=MAX_NEW_TOKENS, prompt_seed=seed, cases=cases)
    (case_dir / "greedy.json").write_text(json.dumps(body, indent=1) + "\n")
    print(f"{base}: {len(cases)} generations, prompt seed {seed}, "
          f"{sum(c['stop'] == 'eos' for c in cases)} end at EOS, "
          f"min margin {min(c['min_margin'] for c in cases):.4f}")


def build_stop_model(out: Path) -> tuple[Path, object]:
    tok_src = GOLDEN_ROOT / "tokenizers" / "qwen2_like"
    model_dir = out / "stop_strings"
    model_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_src / name, model_dir / name)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    vocab = len(tokenizer)
    torch.manual_seed(8001)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        eos_token_id=None,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.15)
    model.save_pretrained(str(model_dir))
    return model_dir, tokenizer


def stop_strings(out: Path) -> None:
    model_dir, tokenizer = build_stop_model(out)
    model = load(model_dir)
    prompt_text = "The weather today is"
    prompt = tokenizer.encode(prompt_text, add_special_tokens=False)
    ids = torch.tensor([prompt])

    def generate(stops: list[str] | None, max_new: int = 24) -> list[int]:
        kwargs = dict(stop_strings=stops, tokenizer=tokenizer) if stops else {}
        with torch.no_grad():
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new, eos_token_id=None, pad_token_id=0, **kwargs)
        return seq[0, len(prompt):].tolist()

    full = generate(None)
    pieces = [tokenizer.decode([t]) for t in full]
    text = "".join(pieces)
    assert text == tokenizer.decode(full), "token texts do not concatenate to the text"
    starts = [sum(len(p) for p in pieces[:i]) for i in range(len(pieces) + 1)]

    def ascii_token(i: int) -> bool:
        return pieces[i].isascii() and len(pieces[i].strip()) >= 2

    candidates = [i for i in range(2, len(full) - 3) if ascii_token(i) and ascii_token(i + 1)]
    assert len(candidates) >= 3, f"continuation has too few plain ASCII tokens: {pieces!r}"
    first, second, third = candidates[0], candidates[len(candidates) // 2], candidates[-1]

    def first_occurrence_end(s: str) -> int:
        return text.index(s) + len(s)

    stops = []
    # Inside one token (the token overhangs both ends of the string).
    stops.append([pieces[first][1:-1] if len(pieces[first]) > 2 else pieces[first]])
    # Exactly one token's text.
    stops.append([pieces[second]])
    # Across a boundary: starts inside token i, ends inside token i + 1.
    stops.append([pieces[third][1:] + pieces[third + 1][:-1]])
    # Two strings: the earlier one wins.
    stops.append([pieces[third], pieces[first]])
    # Never occurs.
    stops.append(["\u2603never"])
    cases = []
    for strings in stops:
        got = generate(strings)
        hits = [first_occurrence_end(s) for s in strings if s in text]
        if hits:
            end = min(hits)
            expected = next(i for i in range(1, len(full) + 1) if starts[i] >= end)
        else:
            expected = len(full)
        assert got == full[: len(got)], "stop strings changed the tokens"
        assert len(got) == expected, f"{strings!r}: transformers stopped after {len(got)}, text rule says {expected}"
        cases.append(dict(stop=strings, tokens=len(got)))
    body = dict(prompt_text=prompt_text, prompt=prompt, continuation=full, text=text, cases=cases)
    (out / "stop_strings.json").write_text(json.dumps(body, indent=1, ensure_ascii=False) + "\n")
    print(f"stop strings: {len(cases)} cases over {text!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="*", help="generate only these bases (and no stop_strings case)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for base in BASES:
        if not args.only or base in args.only:
            run_base(base, args.out)
    if not args.only:
        stop_strings(args.out)


if __name__ == "__main__":
    main()
