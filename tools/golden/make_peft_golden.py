#!/usr/bin/env python3
"""Generate golden PEFT LoRA adapter fixtures for loraplex.

What it produces
----------------
One directory per case under ``tests/fixtures/golden/peft/<case>/`` (or
``--out``), all for the base checkpoint ``tests/fixtures/golden/llama_gqa``
(see ``make_model_golden.py``):

* the ``PeftModel.save_pretrained`` output: ``adapter_config.json`` and
  ``adapter_model.safetensors`` (the model card ``README.md`` PEFT also
  writes is deleted; ``base_model_name_or_path`` is set to ``"llama_gqa"`` so
  no local path is committed);
* ``golden.safetensors`` (not for ``*_init`` cases) with

  - ``input_ids``  int64   [3, 7]    copied from ``llama_gqa/golden.safetensors``
  - ``lengths``    int64   [3]       copied from ``llama_gqa/golden.safetensors``
  - ``logits``     float32 [3, 7, V] logits of base + adapter (PEFT, fp32,
    eager attention, attention mask from ``lengths``); positions
    ``t >= lengths[b]`` are exactly 0.

All cases use ``LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0,
bias="none")``:

* ``q_v_r4``        r=4, lora_alpha=8,  q_proj + v_proj, scaling alpha/r
* ``all_r8_rslora`` r=8, lora_alpha=16, all seven projections, rsLoRA
  scaling alpha/sqrt(r)
* ``mlp_r2``        r=2, lora_alpha=4,  gate_proj + up_proj + down_proj
* ``q_v_r4_init``   same settings as ``q_v_r4`` but PEFT's own
  initialisation (lora_A kaiming-uniform(a=sqrt(5)), lora_B zeros) after
  ``torch.manual_seed(0)``; adapter files only.

``MOE_CASES`` adapt a mixture-of-experts base: the attention by module
name and the stacked experts by ``target_parameters`` (see
``tests/fixtures/golden/peft/README.md`` for what PEFT makes of them).

In the other cases every lora_A / lora_B weight is overwritten with seeded
normal values so that the adapter clearly changes the logits.

Why
---
The C++ side exports its own adapters in PEFT format and must produce the
same tensor names, shapes and ``adapter_config.json`` fields as PEFT; and it
imports PEFT adapters and must reproduce ``logits`` of base + adapter. PEFT
itself is the reference for both.

Besides writing the files, the script checks that: the base model reproduces
``llama_gqa``'s golden logits; padded and unpadded evaluation agree; an
independent merged-weight computation ``W + scaling * B @ A`` gives the same
logits as PEFT; every targeted projection type matters; rsLoRA scaling matters
(alpha/r gives clearly different logits); the saved keys are exactly
``base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}.weight``
with the expected shapes and dtype F32; and a fresh base model plus
``PeftModel.from_pretrained`` reproduces the stored logits.

PEFT stores ``target_modules`` by converting a Python set to a list, so its
order depends on string hashing; the script re-executes itself with
``PYTHONHASHSEED=0`` so that regenerated files are byte-identical.

How to regenerate
-----------------
From the repository root::

    python3 -m venv v && v/bin/pip install -r tools/golden/requirements.txt && v/bin/python tools/golden/make_peft_golden.py

Outputs can differ in the last bits across torch/transformers/peft versions
or CPU types; the versions used are pinned in ``tools/golden/requirements.txt``.
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
import math
import re
import shutil
import warnings
from pathlib import Path

import peft
import safetensors
import torch
import transformers
from packaging.version import Version
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaForCausalLM

# The padded and per-row forwards are shared with the base-model fixtures.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_model_golden import ROUTER_MARGIN, forward, forward_unpadded, router_choices  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
GOLDEN_ROOT = REPO_ROOT / "tests" / "fixtures" / "golden"
BASE_DIR = GOLDEN_ROOT / "llama_gqa"
DEFAULT_OUT = GOLDEN_ROOT / "peft"
BASE_NAME = "llama_gqa"

DTYPE_KW = "dtype" if Version(transformers.__version__) >= Version("4.56.0") else "torch_dtype"

ATTN = ["q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"]
MLP = ["gate_proj", "up_proj", "down_proj", "gate_up_proj"]
# Phi-3's layers: q/k/v and gate/up fused, one LoRA module each.
FUSED = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]

# ``std`` is the standard deviation of the seeded normal values written into
# lora_A and lora_B. It is chosen per case so that the effective update
# scaling * B @ A has an element std of roughly 0.08-0.1 (base weights have
# std 0.15): large enough to move the logits by O(1), small enough that the
# base model still matters.
CASES = [
    dict(name="q_v_r4", r=4, lora_alpha=8, targets=["q_proj", "v_proj"], use_rslora=False, seed=3001, std=0.15),
    dict(name="all_r8_rslora", r=8, lora_alpha=16, targets=ATTN[:4] + MLP[:3], use_rslora=True, seed=3002, std=0.075),
    dict(name="mlp_r2", r=2, lora_alpha=4, targets=MLP[:3], use_rslora=False, seed=3003, std=0.18),
    dict(name="q_v_r4_init", r=4, lora_alpha=8, targets=["q_proj", "v_proj"], use_rslora=False, seed=0, std=None),
] + [
    # One adapter on every projection for each family beyond Llama's layout,
    # on that family's golden base (make_model_golden.py).
    dict(
        name=f"{base}_all_r4",
        base=base,
        r=4,
        lora_alpha=8,
        targets=FUSED if base.startswith("phi3") else ATTN[:4] + MLP[:3],
        use_rslora=False,
        seed=seed,
        std=0.14,
    )
    for base, seed in (
        ("qwen3_tied", 3011),
        ("olmo2_post_norm", 3012),
        ("olmo3_window", 3013),
        ("gemma3_text_window", 3014),
        ("phi3_tied", 3016),
    )
]

# A multimodal base (make_model_golden.py's gemma3_mm): only its text model
# is adapted. SigLIP's attention has q_proj/k_proj/v_proj too, so the text
# model's modules are named by path, as loraplex exports them.
MM_CASES = [dict(name="gemma3_mm_all_r4", base="gemma3_mm", r=4, lora_alpha=8, seed=3017, std=0.14)]

# Mixture-of-experts bases (make_model_golden.py): the attention projections
# by module name, the stacked experts by parameter (target_parameters; PEFT
# refuses lora_dropout there). On Qwen3-MoE, PEFT rewrites target_modules
# gate/up/down_proj into target_parameters gate_up_proj (rank and alpha
# doubled through rank_pattern / alpha_pattern) and down_proj, as for an
# adapter written under transformers 4's per-expert modules: ``all_r4`` is
# that config as given; ``experts_r4`` names the experts' parameters only.
EXPERTS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]
MOE_CASES = [
    # Seed 3043: the widest router margin of 40 on the golden inputs and the
    # family-step datums (make_family_step_golden.py).
    dict(name="qwen3_moe_all_r4", base="qwen3_moe", targets=ATTN[:4] + MLP[:3], seed=3043),
    dict(name="qwen3_moe_experts_r4", base="qwen3_moe", targets=ATTN[:4], seed=3019),
    dict(name="gpt_oss_all_r4", base="gpt_oss", targets=ATTN[:4], seed=3021),
]
MOE_KEY_RE = re.compile(r"^base_model\.model\.(model\.layers\.(\d+)\.(self_attn\.\w+|mlp\.experts(\.base_layer)*))\.lora_([AB])\.weight$")

KEY_RE = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


def base_of(case: dict) -> str:
    return case.get("base", BASE_NAME)


def load_base(name: str = BASE_NAME):
    cls = LlamaForCausalLM if name == BASE_NAME else AutoModelForCausalLM
    m = cls.from_pretrained(str(GOLDEN_ROOT / name), attn_implementation="eager", **{DTYPE_KW: torch.float32})
    m.eval()
    return m


def proj_dims(cfg) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each projection."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    hd = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    return {
        "q_proj": (h, q),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (q, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
        "qkv_proj": (h, q + 2 * kv),
        "gate_up_proj": (h, 2 * i),
    }


def lora_config(case: dict) -> LoraConfig:
    return LoraConfig(
        task_type="CAUSAL_LM",
        r=case["r"],
        lora_alpha=case["lora_alpha"],
        target_modules=list(case["targets"]),
        lora_dropout=0.0,
        bias="none",
        use_rslora=case["use_rslora"],
    )


def scaling_of(case: dict) -> float:
    if case["use_rslora"]:
        return case["lora_alpha"] / math.sqrt(case["r"])
    return case["lora_alpha"] / case["r"]


def mask_of(lengths: torch.Tensor, T: int) -> torch.Tensor:
    return (torch.arange(T)[None, :] < lengths[:, None]).to(torch.int64)


def assert_close(name: str, a: torch.Tensor, b: torch.Tensor, atol: float) -> float:
    diff = (a - b).abs().max().item()
    assert diff <= atol, f"{name}: max abs diff {diff} > {atol}"
    return diff


def lora_params(pm) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in pm.named_parameters() if ".lora_A." in n or ".lora_B." in n}


@torch.no_grad()
def merged_reference(lora_sd: dict[str, torch.Tensor], scaling: float, ids, mask, base_name: str) -> torch.Tensor:
    """Logits of a plain base model with W += scaling * B @ A, no PEFT involved."""
    base = load_base(base_name)
    mods = dict(base.named_modules())
    seen = 0
    for key, a in lora_sd.items():
        m = KEY_RE.match(key)
        assert m, key
        if m.group(4) != "A":
            continue
        b = lora_sd[key.replace(".lora_A.", ".lora_B.")]
        path = f"model.layers.{m.group(1)}.{m.group(2)}.{m.group(3)}"
        mods[path].weight += scaling * (b @ a)
        seen += 1
    assert seen > 0
    return forward(base, ids, mask)


def check_saved_adapter(case: dict, case_dir: Path, cfg) -> dict[str, torch.Tensor]:
    """Checks adapter_model.safetensors / adapter_config.json; returns the tensors."""
    dims = proj_dims(cfg)
    r = case["r"]
    path = case_dir / "adapter_model.safetensors"
    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata()
        keys = list(fh.keys())
        dtypes = {str(fh.get_slice(k).get_dtype()) for k in keys}
    assert dtypes == {"F32"}, f"stored dtypes {dtypes}"
    expected = {}
    for layer in range(cfg.num_hidden_layers):
        for proj in case["targets"]:
            block = "self_attn" if proj in ATTN else "mlp"
            fin, fout = dims[proj]
            prefix = f"base_model.model.model.layers.{layer}.{block}.{proj}"
            expected[f"{prefix}.lora_A.weight"] = [r, fin]
            expected[f"{prefix}.lora_B.weight"] = [fout, r]
    assert set(keys) == set(expected), f"keys {sorted(keys)} != expected {sorted(expected)}"
    sd = load_file(str(path))
    for k in sorted(keys):
        assert KEY_RE.match(k), k
        assert list(sd[k].shape) == expected[k], f"{k}: {list(sd[k].shape)} != {expected[k]}"
        print(f"    {k} {list(sd[k].shape)}")
    print(f"    safetensors metadata: {meta}")

    conf = json.loads((case_dir / "adapter_config.json").read_text())
    want = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": case["lora_alpha"],
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": case["use_rslora"],
        "use_dora": False,
        "fan_in_fan_out": False,
        "base_model_name_or_path": base_of(case),
        "peft_version": peft.__version__,
    }
    for k, v in want.items():
        assert conf.get(k) == v, f"adapter_config.json {k}={conf.get(k)!r}, expected {v!r}"
    assert sorted(conf["target_modules"]) == sorted(case["targets"]), conf["target_modules"]
    print(f"    adapter_config.json keys: {sorted(conf)}")
    return sd


def run_case(case: dict, out_dir: Path, ids, lengths, base_logits) -> None:
    name = case["name"]
    case_dir = out_dir / name
    if case_dir.exists():
        shutil.rmtree(case_dir)
    case_dir.mkdir(parents=True)
    T = ids.shape[1]
    mask = mask_of(lengths, T)
    scaling = scaling_of(case)

    base_name = base_of(case)
    base = load_base(base_name)
    cfg = base.config
    torch.manual_seed(case["seed"])
    pm = get_peft_model(base, lora_config(case))
    pm.eval()
    params = lora_params(pm)
    assert len(params) == 2 * cfg.num_hidden_layers * len(case["targets"]), sorted(params)
    for n, mod in pm.named_modules():
        if hasattr(mod, "scaling") and isinstance(mod.scaling, dict) and "default" in mod.scaling:
            assert math.isclose(mod.scaling["default"], scaling), f"{n}: scaling {mod.scaling['default']} != {scaling}"

    randomized = case["std"] is not None
    if randomized:
        g = torch.Generator().manual_seed(case["seed"] + 1)
        with torch.no_grad():
            for n in sorted(params):
                p = params[n]
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * case["std"])
    else:
        # PEFT default init: B zeros, A kaiming_uniform(a=sqrt(5)) => |A| <= 1/sqrt(in_features).
        for n, p in sorted(params.items()):
            if ".lora_B." in n:
                assert torch.count_nonzero(p) == 0, f"{n} not zero-initialised"
            else:
                bound = 1.0 / math.sqrt(p.shape[1])
                amax = p.abs().max().item()
                assert 0.0 < amax <= bound, f"{n}: max |A| {amax} vs bound {bound}"
                # Uniform(-bound, bound) has std bound/sqrt(3); loose check.
                ratio = p.std().item() / (bound / math.sqrt(3.0))
                assert 0.7 < ratio < 1.3, f"{n}: std ratio {ratio}"
        print("  default init: lora_B all zero, |lora_A| <= 1/sqrt(in_features)")

    tensors = None
    if randomized:
        logits = forward(pm, ids, mask).contiguous()
        d_base = (logits - base_logits).abs().max().item()
        assert d_base > 0.05, f"adapter barely changes logits (max diff {d_base})"
        unpadded = forward_unpadded(pm, ids, lengths)
        pad_diff = assert_close(f"{name} padded vs unpadded", logits, unpadded, 1e-5)

        lora_sd = {}
        for n, p in params.items():
            k = n.replace(".default.weight", ".weight")
            lora_sd[k] = p.detach().clone()
        ref = merged_reference(lora_sd, scaling, ids, mask, base_name)
        d_ref = assert_close(f"{name} merged W + scaling*B@A", ref, logits, 1e-4)

        if case["use_rslora"]:
            plain = merged_reference(lora_sd, case["lora_alpha"] / case["r"], ids, mask, base_name)
            d_rs = (plain - logits).abs().max().item()
            assert d_rs > 0.05, f"rsLoRA scaling makes no visible difference ({d_rs})"
            print(f"  rsLoRA matters: max |diff| vs alpha/r scaling {d_rs:.4f}")

        # Each targeted projection type must visibly contribute.
        contrib = {}
        for proj in case["targets"]:
            sd = {k: (torch.zeros_like(v) if f".{proj}.lora_B." in k else v) for k, v in lora_sd.items()}
            d = (merged_reference(sd, scaling, ids, mask, base_name) - logits).abs().max().item()
            assert d > 1e-2, f"{proj} adapter has no visible effect ({d})"
            contrib[proj] = round(d, 3)
        print(f"  max |diff| when dropping each projection's adapter: {contrib}")
        lg = logits[0]
        print(
            f"  max|peft - base| {d_base:.4f}; padded vs unpadded {pad_diff:.2e}; merged ref {d_ref:.2e}; "
            f"logit std {lg.std().item():.3f}, max softmax prob {lg.softmax(-1).max().item():.3f}"
        )
        tensors = {"input_ids": ids, "lengths": lengths, "logits": logits}

    pm.peft_config["default"].base_model_name_or_path = base_name
    with warnings.catch_warnings():
        # PEFT looks for BASE_NAME's config.json to see whether the vocabulary
        # was resized; no embedding layer is targeted, so this does not matter.
        warnings.filterwarnings("ignore", message="Could not find a config file")
        pm.save_pretrained(str(case_dir), safe_serialization=True)
    card = case_dir / "README.md"
    if card.exists():
        card.unlink()
    if tensors is not None:
        # No safetensors metadata: keeps regenerated files byte-identical.
        save_file(tensors, str(case_dir / "golden.safetensors"))

    # ---- checks on what was written ----
    files = sorted(p.name for p in case_dir.iterdir())
    want_files = ["adapter_config.json", "adapter_model.safetensors"] + (["golden.safetensors"] if tensors else [])
    assert files == sorted(want_files), files
    sd = check_saved_adapter(case, case_dir, cfg)
    for n, p in params.items():
        assert torch.equal(sd[n.replace(".default.weight", ".weight")], p.detach()), n

    # Reload onto a fresh base and reproduce the stored logits.
    fresh = load_base(base_name)
    re_pm = PeftModel.from_pretrained(fresh, str(case_dir))
    re_pm.eval()
    re_logits = forward(re_pm, ids, mask)
    if tensors is not None:
        d_re = assert_close(f"{name} reload", re_logits, tensors["logits"], 1e-6)
        print(f"  reload max|diff| {d_re:.2e}")
    else:
        d_re = assert_close(f"{name} reload (zero B)", re_logits, base_logits, 0.0)
        print("  reload: logits equal the base logits exactly")


def run_multimodal_case(case: dict, out_dir: Path) -> None:
    name, base_name = case["name"], case["base"]
    case_dir = out_dir / name
    if case_dir.exists():
        shutil.rmtree(case_dir)
    case_dir.mkdir(parents=True)
    cls = transformers.Gemma3ForConditionalGeneration

    def load():
        m = cls.from_pretrained(str(GOLDEN_ROOT / base_name), attn_implementation="eager", **{DTYPE_KW: torch.float32})
        return m.eval()

    golden = load_file(str(GOLDEN_ROOT / base_name / "golden.safetensors"))
    ids, lengths = golden["input_ids"], golden["lengths"]
    mask = mask_of(lengths, ids.shape[1])
    base = load()
    base_logits = forward(base, ids, mask)
    assert_close(f"base vs {base_name} golden", base_logits, golden["logits"], 1e-6)
    layers = base.config.text_config.num_hidden_layers
    targets = [
        f"model.language_model.layers.{i}.{'self_attn' if p in ATTN else 'mlp'}.{p}"
        for p in ATTN[:4] + MLP[:3]
        for i in range(layers)
    ]

    # Module names alone would adapt the vision tower too.
    probe = get_peft_model(load(), LoraConfig(task_type="CAUSAL_LM", r=2, target_modules=["q_proj"]))
    assert any("vision_tower" in n for n, _ in lora_params(probe).items()), "q_proj did not reach the vision tower"

    config = LoraConfig(
        task_type="CAUSAL_LM", r=case["r"], lora_alpha=case["lora_alpha"], target_modules=targets, lora_dropout=0.0
    )
    torch.manual_seed(case["seed"])
    pm = get_peft_model(base, config).eval()
    params = lora_params(pm)
    assert len(params) == 2 * len(targets), sorted(params)
    assert all(".language_model." in n for n in params), sorted(params)
    g = torch.Generator().manual_seed(case["seed"] + 1)
    with torch.no_grad():
        for n in sorted(params):
            params[n].copy_(torch.randn(params[n].shape, generator=g, dtype=torch.float32) * case["std"])
    logits = forward(pm, ids, mask).contiguous()
    d_base = (logits - base_logits).abs().max().item()
    assert d_base > 0.05, f"adapter barely changes logits ({d_base})"
    assert_close(f"{name} padded vs unpadded", logits, forward_unpadded(pm, ids, lengths), 1e-5)

    pm.peft_config["default"].base_model_name_or_path = base_name
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Could not find a config file")
        pm.save_pretrained(str(case_dir), safe_serialization=True)
    (case_dir / "README.md").unlink(missing_ok=True)
    save_file({"input_ids": ids, "lengths": lengths, "logits": logits}, str(case_dir / "golden.safetensors"))

    keys = set(load_file(str(case_dir / "adapter_model.safetensors")))
    want = {f"base_model.model.{t}.lora_{ab}.weight" for t in targets for ab in "AB"}
    assert keys == want, sorted(keys ^ want)
    # PEFT writes target_modules as the shortest suffixes naming these
    # modules only ("1.self_attn.q_proj", "language_model.layers.0...").
    conf = json.loads((case_dir / "adapter_config.json").read_text())
    print(f"  target_modules as PEFT saves them: {sorted(conf['target_modules'])}")

    # PEFT loads it onto a fresh base without a warning and gives the logits.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        re_pm = PeftModel.from_pretrained(load(), str(case_dir)).eval()
    caught = [w for w in caught if "peft" in str(w.filename) or "adapter" in str(w.message).lower()]
    assert not caught, [str(w.message) for w in caught]
    assert set(lora_params(re_pm)) == set(params), "the reload adapts other modules"
    d_re = assert_close(f"{name} reload", forward(re_pm, ids, mask), logits, 1e-6)
    print(f"  {len(keys)} tensors; max|peft - base| {d_base:.4f}; reload max|diff| {d_re:.2e}")


def load_moe_base(name: str):
    m = AutoModelForCausalLM.from_pretrained(
        str(GOLDEN_ROOT / name), attn_implementation="eager", experts_implementation="eager", **{DTYPE_KW: torch.float32}
    )
    return m.eval()


def expert_wrappers(pm) -> dict[str, tuple[str, float]]:
    """Saved-key path of each PEFT ParamWrapper -> (the parameter it adapts,
    its scaling). Wrappers on one module nest: the inner one's path ends in
    ``.base_layer``."""
    return {
        n.removeprefix("base_model.model."): (mod.parameter_name, mod.scaling["default"])
        for n, mod in pm.named_modules()
        if isinstance(mod, peft.tuners.lora.layer.ParamWrapper)
    }


@torch.no_grad()
def moe_merged_reference(sd, wrappers, ids, mask, base_name: str, b_expert_major: bool = False) -> torch.Tensor:
    """Logits of the plain base with W += scaling * B @ A, per expert for the
    stacked parameters: lora_A [E*r, in] holds expert e's rows at e*r..e*r+r-1
    (expert-major), lora_B [out, r*E] its columns at j*E+e (rank-major), as
    PEFT's ParamWrapper.get_delta_weight reshapes them."""
    base = load_moe_base(base_name)
    mods = dict(base.named_modules())
    for key, a in sd.items():
        m = MOE_KEY_RE.match(key)
        assert m, key
        if m.group(5) != "A":
            continue
        b = sd[key.replace(".lora_A.", ".lora_B.")]
        path = m.group(1)
        if path not in wrappers:
            mods[path].weight += 2.0 * (b @ a)  # lora_alpha / r
            continue
        pname, scaling = wrappers[path]
        experts = mods[path.split(".base_layer")[0]]
        w = getattr(experts, pname)
        e, r = w.shape[0], a.shape[0] // w.shape[0]
        a_e = a.reshape(e, r, -1)
        if b_expert_major:
            b_e = b.reshape(b.shape[0], e, r).permute(1, 0, 2)
        else:
            b_e = b.reshape(b.shape[0], r, e).permute(2, 0, 1)
        delta = scaling * (b_e @ a_e)  # [E, out, in]
        w += delta.transpose(1, 2) if getattr(experts, "is_transposed", False) else delta
    return forward(base, ids, mask)


def run_moe_case(case: dict, out_dir: Path) -> None:
    name, base_name = case["name"], case["base"]
    case_dir = out_dir / name
    if case_dir.exists():
        shutil.rmtree(case_dir)
    case_dir.mkdir(parents=True)
    golden = load_file(str(GOLDEN_ROOT / base_name / "golden.safetensors"))
    ids, lengths = golden["input_ids"], golden["lengths"]
    mask = mask_of(lengths, ids.shape[1])
    base = load_moe_base(base_name)
    base_logits = forward(base, ids, mask)
    assert_close(f"base vs {base_name} golden", base_logits, golden["logits"], 1e-6)

    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=4,
        lora_alpha=8,
        target_modules=list(case["targets"]),
        target_parameters=list(EXPERTS),
        lora_dropout=0.0,
        bias="none",
    )
    torch.manual_seed(case["seed"])
    with warnings.catch_warnings():
        # rank_pattern / alpha_pattern name parameters, which PEFT's module
        # matching does not see; the wrappers take them (checked below).
        warnings.filterwarnings("ignore", message="The following (rank|alpha)_pattern keys")
        pm = get_peft_model(base, config).eval()
    params = lora_params(pm)
    wrappers = expert_wrappers(pm)
    g = torch.Generator().manual_seed(case["seed"] + 1)
    with torch.no_grad():
        for n in sorted(params):
            params[n].copy_(torch.randn(params[n].shape, generator=g, dtype=torch.float32) * 0.14)
    logits = forward(pm, ids, mask).contiguous()
    d_base = (logits - base_logits).abs().max().item()
    assert d_base > 0.05, f"adapter barely changes logits ({d_base})"
    pad_diff = assert_close(f"{name} padded vs unpadded", logits, forward_unpadded(pm, ids, lengths), 1e-5)
    margin, _ = router_choices(pm, ids, mask)
    assert margin > ROUTER_MARGIN, f"router near-tie: margin {margin:.2e}"

    sd = {n.replace(".default.weight", ".weight"): p.detach().clone() for n, p in params.items()}
    d_ref = assert_close(f"{name} merged reference", moe_merged_reference(sd, wrappers, ids, mask, base_name), logits, 1e-4)
    d_alt = (moe_merged_reference(sd, wrappers, ids, mask, base_name, b_expert_major=True) - logits).abs().max().item()
    assert d_alt > 1e-2, f"lora_B's expert-major reading gives the same logits ({d_alt})"
    contrib = {}
    for target in sorted({m.group(3).split(".base_layer")[0] if m.group(1) not in wrappers else wrappers[m.group(1)][0]
                          for m in map(MOE_KEY_RE.match, sd)}):
        def dropped(k):
            m = MOE_KEY_RE.match(k)
            t = wrappers[m.group(1)][0] if m.group(1) in wrappers else m.group(3)
            return t == target and m.group(5) == "B"
        zeroed = {k: (torch.zeros_like(v) if dropped(k) else v) for k, v in sd.items()}
        d = (moe_merged_reference(zeroed, wrappers, ids, mask, base_name) - logits).abs().max().item()
        assert d > 1e-2, f"{target} adapter has no visible effect ({d})"
        contrib[target] = round(d, 3)
    print(f"  min router margin {margin:.4f}; max |diff| when dropping each target's adapter: {contrib}")
    print(
        f"  max|peft - base| {d_base:.4f}; padded vs unpadded {pad_diff:.2e}; merged ref {d_ref:.2e}; "
        f"lora_B read expert-major instead: {d_alt:.3f}"
    )

    pm.peft_config["default"].base_model_name_or_path = base_name
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Could not find a config file")
        pm.save_pretrained(str(case_dir), safe_serialization=True)
    (case_dir / "README.md").unlink(missing_ok=True)
    save_file({"input_ids": ids, "lengths": lengths, "logits": logits}, str(case_dir / "golden.safetensors"))

    saved = load_file(str(case_dir / "adapter_model.safetensors"))
    assert set(saved) == set(sd) and all(torch.equal(saved[k], sd[k]) for k in sd), sorted(set(saved) ^ set(sd))
    for k in sorted(saved):
        if ".layers.0." in k or ".layers.1." in k:
            print(f"    {k} {list(saved[k].shape)}")
    conf = json.loads((case_dir / "adapter_config.json").read_text())
    print(
        f"  adapter_config: target_modules {sorted(conf['target_modules'])}, target_parameters "
        f"{sorted(conf['target_parameters'])}, rank_pattern {conf['rank_pattern']}, alpha_pattern {conf['alpha_pattern']}"
    )
    assert sorted(conf["target_modules"]) == sorted(ATTN[:4]), conf["target_modules"]
    fused = any(t in MLP for t in case["targets"])
    assert conf["rank_pattern"] == ({r".*\.gate_up_proj": 8} if fused else {}), conf["rank_pattern"]
    assert {wrappers[k][1] for k in wrappers} == {2.0}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        re_pm = PeftModel.from_pretrained(load_moe_base(base_name), str(case_dir)).eval()
    caught = [str(w.message) for w in caught if "peft" in str(w.filename)]
    assert set(lora_params(re_pm)) == set(params), "the reload adapts other parameters"
    d_re = assert_close(f"{name} reload", forward(re_pm, ids, mask), logits, 1e-6)
    print(f"  {len(saved)} tensors; reload max|diff| {d_re:.2e}; PEFT warnings on reload: {caught}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    ap.add_argument("--only", nargs="*", help="generate only these cases")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}, "
        f"safetensors {safetensors.__version__} -> {args.out}"
    )

    base_golden = load_file(str(BASE_DIR / "golden.safetensors"))
    ids, lengths = base_golden["input_ids"], base_golden["lengths"]
    assert ids.dtype == torch.int64 and lengths.dtype == torch.int64
    base = load_base()
    c = base.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    print(
        f"base {BASE_NAME}: hidden {c.hidden_size}, intermediate {c.intermediate_size}, layers {c.num_hidden_layers}, "
        f"heads {c.num_attention_heads}, kv heads {c.num_key_value_heads}, head_dim {hd}, vocab {c.vocab_size}; "
        f"input_ids {list(ids.shape)}, lengths {lengths.tolist()}"
    )
    base_logits = forward(base, ids, mask_of(lengths, ids.shape[1]))
    d = assert_close("base vs llama_gqa golden", base_logits, base_golden["logits"], 1e-6)
    print(f"base reproduces llama_gqa golden logits (max|diff| {d:.2e})")

    for case in CASES:
        if args.only and case["name"] not in args.only:
            continue
        print(f"[{case['name']}]")
        if base_of(case) == BASE_NAME:
            run_case(case, args.out, ids, lengths, base_logits)
            continue
        # The family's base, its own golden inputs and logits.
        golden = load_file(str(GOLDEN_ROOT / base_of(case) / "golden.safetensors"))
        family_base = load_base(base_of(case))
        family_logits = forward(family_base, golden["input_ids"], mask_of(golden["lengths"], golden["input_ids"].shape[1]))
        assert_close(f"base vs {base_of(case)} golden", family_logits, golden["logits"], 1e-6)
        run_case(case, args.out, golden["input_ids"], golden["lengths"], family_logits)
    for case in MM_CASES:
        if args.only and case["name"] not in args.only:
            continue
        print(f"[{case['name']}]")
        run_multimodal_case(case, args.out)
    for case in MOE_CASES:
        if args.only and case["name"] not in args.only:
            continue
        print(f"[{case['name']}]")
        run_moe_case(case, args.out)
    print("all cases written and verified")


if __name__ == "__main__":
    main()
