#!/usr/bin/env python3
"""Generate golden fixtures for the loraplex optimizers (Muon and Adam/AdamW).

What it produces
----------------
Two files under ``tests/fixtures/golden/optim/`` (or ``--out``):

* ``cases.json`` lists every case with its hyper-parameters::

    {"generator": "tools/golden/make_optim_golden.py", "torch_version": "...",
     "muon": [{"name", "shape": [m, n], "lr", "weight_decay",
               "weight_decay_mode": "decoupled|independent|l2", "momentum",
               "nesterov", "coefficient_set": "simple|quintic|polar_express|aol|custom",
               "custom_coefficients": [[a, b, c], ...]  (custom only),
               "ns_steps", "scale_mode": "spectral|unit_rms_norm|shape_scaling",
               "extra_scale_factor", "steps": 3}, ...],
     "adam": [{"name", "family": "adam|adamw", "shape": [m, n], "lr",
               "betas": [b1, b2], "eps", "weight_decay", "steps": 3}, ...],
     "newton_schulz": [{"name", "shape": [m, n], "coefficient_set", "ns_steps"}, ...]}

* ``optim_golden.safetensors``, all tensors float32 and contiguous:

  - Muon and Adam cases: ``<name>.param`` [m, n] initial parameter,
    ``<name>.grads`` [3, m, n] gradient fed at steps 1..3, ``<name>.expected``
    [3, m, n] parameter after steps 1, 2 and 3;
  - Muon cases also: ``<name>.momentum`` [m, n] momentum buffer after step 3;
  - Adam cases also: ``<name>.exp_avg`` and ``<name>.exp_avg_sq`` [m, n]
    optimizer state after step 3;
  - Newton-Schulz cases: ``<name>.input`` and ``<name>.output`` [m, n].

Muon, per 2-D parameter p (m x n), gradient g, buffer buf (zeros at first),
one step is:

1. weight decay: ``decoupled`` p <- p - lr*wd*p; ``independent`` p <- p - wd*p;
   ``l2`` g <- g + wd*p (p itself unchanged here);
2. buf <- beta*buf + (1 - beta)*g;
3. u <- (1 - beta)*g + beta*buf if nesterov, else buf;
4. O <- NS(u) * scale(m, n) * extra_scale_factor, with scale ``spectral``
   sqrt(max(m, n)), ``unit_rms_norm`` sqrt(m/n), ``shape_scaling``
   sqrt(max(1, m/n));
5. p <- p - lr*O.

NS(x): if m > n work on x^T (the wide form); X <- x / max(||x||_F, 1e-7); for
i in 0..steps-1 with (a, b, c) = coeffs(i): A = X X^T, B = b*A + c*A*A,
X <- a*X + B*X; undo the transpose. The ``simple``, ``quintic``, ``aol`` and
``custom`` coefficient lists cycle (tuple i mod len); ``polar_express`` repeats
its last tuple once i >= len.

Cases: Muon on tall (24x8), wide (8x24), square (16x16), lora_a (4x32) and
lora_b (32x4) parameters, (A) every coefficient set with and without Nesterov,
(B) every scale mode and weight-decay mode, (C) step counts that make the
coefficient lists cycle or repeat, plus a custom list, (D) all-zero gradients;
Adam and AdamW with and without weight decay; Newton-Schulz alone on
tall / wide / square inputs for every coefficient set.

Why
---
The C++ optimizers must match an implementation written independently of
them. Muon and Newton-Schulz are written here as plain per-matrix PyTorch code
straight from the formulas above and evaluated in float64 (inputs are float32
values upcast); results are stored cast to float32. Adam and AdamW come from
``torch.optim.Adam`` / ``torch.optim.AdamW`` (float32, ``foreach=False``).

For choosing test tolerances the script also runs every case in float32 and
prints, per family, the worst relative discrepancy
max|a - b| / max|b| between the float32 and float64 results (for the
optimizers, over the parameter update p_after - p_init). These numbers are
printed only, never stored.

Self-checks: NS of zeros is exactly zero; NS of a tall input is the transpose
of NS of its wide transpose; NS agrees with the same polynomials applied to
the singular values directly (via an SVD); the NS singular values of a random
matrix lie in a band around 1 (printed); the first Muon step equals the closed
form; a hand-written float64 Adam/AdamW agrees with torch.optim.

Everything is deterministic (seeds derived from case names).

How to regenerate
-----------------
From the repository root::

    python3 -m venv v && v/bin/pip install -r tools/golden/requirements.txt && v/bin/python tools/golden/make_optim_golden.py

Outputs can differ in the last bits across torch versions or CPU types; the
versions used are pinned in ``tools/golden/requirements.txt``.
"""

from __future__ import annotations

import argparse
import json
import math
import zlib
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "golden" / "optim"

STEPS = 3

SHAPES = {
    "tall": (24, 8),
    "wide": (8, 24),
    "square": (16, 16),
    "lora_a": (4, 32),  # r x in
    "lora_b": (32, 4),  # out x r
}

COEFFICIENT_SETS = {
    "simple": [(3.4445, -4.7750, 2.0315)],
    "quintic": [
        (4.0848, -6.8946, 2.9270),
        (3.9505, -6.3029, 2.6377),
        (3.7418, -5.5913, 2.3037),
        (2.8769, -3.1427, 1.2046),
        (2.8366, -3.0525, 1.2012),
    ],
    "polar_express": [
        (8.2051, -22.9019, 16.4607),
        (4.0664, -2.8612, 0.5184),
        (3.9096, -2.8234, 0.5250),
        (3.2856, -2.4153, 0.4853),
        (2.2779, -1.6198, 0.3985),
        (1.8726, -1.2307, 0.3585),
        (1.8564, -1.2132, 0.3568),
        (1.8750, -1.2500, 0.3750),
    ],
    "aol": [
        (4.0098, -7.0585, 2.4635),
        (3.4585, -5.5479, 2.5959),
        (2.7573, -3.2939, 1.4254),
        (2.7215, -3.0494, 1.3169),
    ],
}
# Sets whose last tuple is repeated once the list runs out; the others cycle.
REPEAT_LAST = {"polar_express"}

SCALE_MODES = ["spectral", "unit_rms_norm", "shape_scaling"]
WEIGHT_DECAY_MODES = ["decoupled", "independent", "l2"]

CUSTOM_COEFFICIENTS = [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)]

NS_EPS = 1e-7


# ---------------------------------------------------------------------------
# Reference implementation (dtype-generic; the goldens use float64)
# ---------------------------------------------------------------------------


def coefficient_list(case: dict) -> list[tuple[float, float, float]]:
    if case["coefficient_set"] == "custom":
        return [tuple(c) for c in case["custom_coefficients"]]
    return COEFFICIENT_SETS[case["coefficient_set"]]


def coefficients_at(coeffs: list, i: int, repeat_last: bool) -> tuple[float, float, float]:
    if repeat_last:
        return coeffs[min(i, len(coeffs) - 1)]
    return coeffs[i % len(coeffs)]


def newton_schulz(x: torch.Tensor, coeffs: list, steps: int, repeat_last: bool) -> torch.Tensor:
    """NS orthogonalisation of one 2-D matrix, in x's dtype."""
    assert x.dim() == 2
    m, n = x.shape
    transposed = m > n
    X = x.t() if transposed else x
    norm = torch.sqrt((X * X).sum())
    X = X / torch.clamp(norm, min=NS_EPS)
    for i in range(steps):
        a, b, c = coefficients_at(coeffs, i, repeat_last)
        A = X @ X.t()
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    if transposed:
        X = X.t()
    return X.contiguous()


def scale_factor(mode: str, m: int, n: int) -> float:
    if mode == "spectral":
        return math.sqrt(max(m, n))
    if mode == "unit_rms_norm":
        return math.sqrt(m / n)
    if mode == "shape_scaling":
        return math.sqrt(max(1.0, m / n))
    raise ValueError(mode)


def muon_run(case: dict, param: torch.Tensor, grads: torch.Tensor, dtype: torch.dtype):
    """Runs case["steps"] Muon steps; returns (params after each step, final buffer)."""
    lr = case["lr"]
    wd = case["weight_decay"]
    mode = case["weight_decay_mode"]
    beta = case["momentum"]
    m, n = case["shape"]
    coeffs = coefficient_list(case)
    repeat_last = case["coefficient_set"] in REPEAT_LAST
    scale = scale_factor(case["scale_mode"], m, n) * case["extra_scale_factor"]

    p = param.to(dtype).clone()
    buf = torch.zeros_like(p)
    history = []
    for k in range(case["steps"]):
        g = grads[k].to(dtype).clone()
        # 1. weight decay
        if mode == "decoupled":
            p = p - lr * wd * p
        elif mode == "independent":
            p = p - wd * p
        elif mode == "l2":
            g = g + wd * p
        else:
            raise ValueError(mode)
        # 2. momentum
        buf = beta * buf + (1.0 - beta) * g
        # 3. Nesterov
        u = (1.0 - beta) * g + beta * buf if case["nesterov"] else buf
        # 4. orthogonalised, scaled update
        O = newton_schulz(u, coeffs, case["ns_steps"], repeat_last) * scale
        # 5. apply
        p = p - lr * O
        history.append(p.clone())
    return torch.stack(history), buf


def adam_torch(case: dict, param: torch.Tensor, grads: torch.Tensor, dtype: torch.dtype):
    """torch.optim.Adam / AdamW; returns (params after each step, exp_avg, exp_avg_sq)."""
    p = torch.nn.Parameter(param.to(dtype).clone())
    cls = torch.optim.AdamW if case["family"] == "adamw" else torch.optim.Adam
    opt = cls(
        [p],
        lr=case["lr"],
        betas=tuple(case["betas"]),
        eps=case["eps"],
        weight_decay=case["weight_decay"],
        amsgrad=False,
        maximize=False,
        foreach=False,
        fused=False,
    )
    history = []
    for k in range(case["steps"]):
        p.grad = grads[k].to(dtype).clone()
        opt.step()
        history.append(p.detach().clone())
    state = opt.state[p]
    return torch.stack(history), state["exp_avg"].clone(), state["exp_avg_sq"].clone()


def adam_by_hand(case: dict, param: torch.Tensor, grads: torch.Tensor):
    """Textbook Adam (L2 into the gradient) / AdamW (decoupled decay), float64."""
    lr, eps, wd = case["lr"], case["eps"], case["weight_decay"]
    b1, b2 = case["betas"]
    p = param.double().clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    history = []
    for k in range(case["steps"]):
        t = k + 1
        g = grads[k].double()
        if case["family"] == "adamw":
            p = p * (1.0 - lr * wd)
        else:
            g = g + wd * p
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * g * g
        m_hat = m / (1.0 - b1**t)
        v_hat = v / (1.0 - b2**t)
        p = p - lr * m_hat / (torch.sqrt(v_hat) + eps)
        history.append(p.clone())
    return torch.stack(history), m, v


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------


def muon_case(name: str, shape: str, **kw) -> dict:
    case = {
        "name": name,
        "shape": list(SHAPES[shape]),
        "lr": kw["lr"],
        "weight_decay": kw["weight_decay"],
        "weight_decay_mode": kw["weight_decay_mode"],
        "momentum": kw["momentum"],
        "nesterov": kw["nesterov"],
        "coefficient_set": kw["coefficient_set"],
    }
    if kw["coefficient_set"] == "custom":
        case["custom_coefficients"] = [list(c) for c in kw["custom_coefficients"]]
    case.update(
        ns_steps=kw["ns_steps"],
        scale_mode=kw["scale_mode"],
        extra_scale_factor=kw["extra_scale_factor"],
        steps=STEPS,
    )
    return case


def make_muon_cases() -> list[tuple[str, dict, dict]]:
    """Returns (group, case, data options) triples."""
    out = []
    # A: coefficient sets x Nesterov.
    for shape in SHAPES:
        for cs in COEFFICIENT_SETS:
            for nesterov in (False, True):
                name = f"muon_{shape}_{cs}_{'nesterov' if nesterov else 'plain'}"
                out.append(("A", muon_case(
                    name, shape, lr=0.02, weight_decay=0.1, weight_decay_mode="decoupled",
                    momentum=0.95, nesterov=nesterov, coefficient_set=cs, ns_steps=5,
                    scale_mode="spectral", extra_scale_factor=1.0), {}))
    # B: scale modes x weight-decay modes.
    for shape in SHAPES:
        for sm in SCALE_MODES:
            for wm in WEIGHT_DECAY_MODES:
                name = f"muon_{shape}_{sm}_{wm}"
                out.append(("B", muon_case(
                    name, shape, lr=0.02, weight_decay=0.1, weight_decay_mode=wm,
                    momentum=0.9, nesterov=False, coefficient_set="quintic", ns_steps=5,
                    scale_mode=sm, extra_scale_factor=0.2), {}))
    # C: step counts that cycle / repeat the coefficient lists.
    variants = [("simple", 3), ("quintic", 7), ("polar_express", 10), ("aol", 6), ("custom", 5)]
    for shape in ("square", "lora_a"):
        for cs, steps in variants:
            name = f"muon_{shape}_{cs}_ns{steps}"
            extra = {"custom_coefficients": CUSTOM_COEFFICIENTS} if cs == "custom" else {}
            out.append(("C", muon_case(
                name, shape, lr=0.05, weight_decay=0.0, weight_decay_mode="decoupled",
                momentum=0.95, nesterov=True, coefficient_set=cs, ns_steps=steps,
                scale_mode="spectral", extra_scale_factor=1.0, **extra), {}))
    # D: all-zero gradients; only weight decay moves the parameter.
    out.append(("D", muon_case(
        "muon_square_zero_grad", "square", lr=0.02, weight_decay=0.1,
        weight_decay_mode="decoupled", momentum=0.95, nesterov=False,
        coefficient_set="quintic", ns_steps=5, scale_mode="spectral",
        extra_scale_factor=1.0), {"zero_grads": True}))
    return out


def make_adam_cases() -> list[dict]:
    out = []
    for family in ("adam", "adamw"):
        for shape in ("square", "lora_a"):
            for wd, tag in ((0.0, "wd0"), (0.1, "wd0p1")):
                out.append({
                    "name": f"{family}_{shape}_{tag}", "family": family,
                    "shape": list(SHAPES[shape]), "lr": 0.01, "betas": [0.9, 0.999],
                    "eps": 1e-8, "weight_decay": wd, "steps": STEPS,
                })
    out.append({
        "name": "adamw_lora_a_b0p8_0p95_eps1em6_wd0p05", "family": "adamw",
        "shape": list(SHAPES["lora_a"]), "lr": 0.003, "betas": [0.8, 0.95],
        "eps": 1e-6, "weight_decay": 0.05, "steps": STEPS,
    })
    return out


def make_ns_cases() -> list[dict]:
    out = []
    for shape in ("tall", "wide", "square"):
        for cs in COEFFICIENT_SETS:
            out.append({"name": f"ns_{shape}_{cs}_5", "shape": list(SHAPES[shape]),
                        "coefficient_set": cs, "ns_steps": 5})
        out.append({"name": f"ns_{shape}_polar_express_10", "shape": list(SHAPES[shape]),
                    "coefficient_set": "polar_express", "ns_steps": 10})
    return out


def generator_for(name: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(name.encode()))


def make_param_and_grads(name: str, shape, zero_grads: bool = False):
    g = generator_for(name)
    m, n = shape
    param = torch.randn(m, n, generator=g, dtype=torch.float32) * 0.5
    grads = torch.randn(STEPS, m, n, generator=g, dtype=torch.float32)
    if zero_grads:
        grads = torch.zeros_like(grads)
    return param.contiguous(), grads.contiguous()


# ---------------------------------------------------------------------------
# Checks and calibration
# ---------------------------------------------------------------------------


def rel_discrepancy(a: torch.Tensor, b: torch.Tensor) -> float:
    """max|a - b| / max|b| (b is the reference); 0 when both are zero."""
    a = a.double()
    b = b.double()
    num = (a - b).abs().max().item()
    den = b.abs().max().item()
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def update_discrepancy(p0: torch.Tensor, got: torch.Tensor, ref: torch.Tensor) -> float:
    """Worst over steps of rel_discrepancy on the update p_after - p_init."""
    p0 = p0.double()
    return max(rel_discrepancy(got[k].double() - p0, ref[k].double() - p0) for k in range(ref.shape[0]))


def ns_via_svd(x: torch.Tensor, coeffs: list, steps: int, repeat_last: bool) -> torch.Tensor:
    """Same polynomial iteration applied to the singular values directly."""
    U, S, Vh = torch.linalg.svd(x.double(), full_matrices=False)
    s = S / max(torch.linalg.norm(x.double()).item(), NS_EPS)
    for i in range(steps):
        a, b, c = coefficients_at(coeffs, i, repeat_last)
        s = a * s + b * s**3 + c * s**5
    return U @ torch.diag(s) @ Vh


def self_checks() -> None:
    print("self-checks")
    g = torch.Generator().manual_seed(12345)
    sets = dict(COEFFICIENT_SETS, custom=CUSTOM_COEFFICIENTS)
    for cs, coeffs in sets.items():
        rep = cs in REPEAT_LAST
        for steps in (5, 10):
            # NS of zeros is exactly zero (the norm clamp avoids 0/0).
            for shape in ((24, 8), (8, 24), (16, 16)):
                for dt in (torch.float64, torch.float32):
                    z = newton_schulz(torch.zeros(shape, dtype=dt), coeffs, steps, rep)
                    assert torch.isfinite(z).all() and (z == 0).all(), f"NS({cs}) of zeros not zero"
            # Tall input == transpose of the wide computation.
            x = torch.randn(24, 8, generator=g, dtype=torch.float64)
            y_tall = newton_schulz(x, coeffs, steps, rep)
            y_wide = newton_schulz(x.t().contiguous(), coeffs, steps, rep)
            d = (y_tall - y_wide.t()).abs().max().item()
            assert d < 1e-13, f"NS({cs}) tall != wide^T: {d}"
            # Matrix iteration == scalar iteration on singular values.
            for shape in ((24, 8), (8, 24), (16, 16)):
                x = torch.randn(shape, generator=g, dtype=torch.float64)
                y = newton_schulz(x, coeffs, steps, rep)
                ref = ns_via_svd(x, coeffs, steps, rep)
                d = (y - ref).abs().max().item()
                assert d < 1e-9, f"NS({cs}, {steps}) vs SVD form: {d}"
            # Singular values of NS(random) lie in a band around 1.
            x = torch.randn(16, 16, generator=g, dtype=torch.float64)
            sv = torch.linalg.svdvals(newton_schulz(x, coeffs, steps, rep))
            lo, hi = sv.min().item(), sv.max().item()
            print(f"  NS {cs:13s} steps={steps:2d}: singular values of NS(randn 16x16) in [{lo:.4f}, {hi:.4f}]")
            if cs != "custom":
                assert 0.3 < lo and hi < 1.3, f"NS({cs}, {steps}) singular values outside band"

    # The coefficient selection: cycling vs repeating the last tuple.
    q = COEFFICIENT_SETS["quintic"]
    pe = COEFFICIENT_SETS["polar_express"]
    assert coefficients_at(q, 5, False) == q[0] and coefficients_at(q, 6, False) == q[1]
    assert coefficients_at(pe, 8, True) == pe[-1] and coefficients_at(pe, 9, True) == pe[-1]

    # First Muon step in closed form: buf = (1-beta) g, Nesterov u = (1-beta^2) g;
    # NS is invariant to positive scaling of its input.
    for nesterov in (False, True):
        case = muon_case("check", "lora_b", lr=0.02, weight_decay=0.1, weight_decay_mode="decoupled",
                         momentum=0.95, nesterov=nesterov, coefficient_set="quintic", ns_steps=5,
                         scale_mode="spectral", extra_scale_factor=0.5)
        p0, grads = make_param_and_grads("check", (32, 4))
        hist, buf = muon_run(case, p0, grads, torch.float64)
        g0 = grads[0].double()
        expect = p0.double() * (1 - 0.02 * 0.1) - 0.02 * math.sqrt(32) * 0.5 * newton_schulz(g0, q, 5, False)
        d = (hist[0] - expect).abs().max().item()
        assert d < 1e-12, f"first Muon step vs closed form: {d}"
        assert torch.allclose(buf, 0.95**2 * 0.05 * g0 + 0.95 * 0.05 * grads[1].double() + 0.05 * grads[2].double(),
                              rtol=0, atol=1e-12)
    print("  ok")


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def fmt_cases(cases: list[dict]) -> str:
    if not cases:
        return "[]"
    return "[\n" + ",\n".join("    " + json.dumps(c) for c in cases) + "\n  ]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    args = ap.parse_args()
    torch.set_num_threads(1)

    self_checks()

    tensors: dict[str, torch.Tensor] = {}
    # family -> (worst relative discrepancy, case it came from, worst max|a - b|)
    calib: dict[str, tuple[float, str, float]] = {}

    def note(key: str, value: float, case_name: str, abs_diff: float) -> None:
        rel, where, absd = calib.get(key, (-1.0, "", 0.0))
        if value > rel:
            rel, where = value, case_name
        calib[key] = (rel, where, max(absd, abs_diff))

    def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a.double() - b.double()).abs().max().item()

    # ---- Muon ----
    muon = make_muon_cases()
    muon_json = []
    for group, case, opts in muon:
        name = case["name"]
        p0, grads = make_param_and_grads(name, case["shape"], opts.get("zero_grads", False))
        hist64, buf64 = muon_run(case, p0, grads, torch.float64)
        hist32, _ = muon_run(case, p0, grads, torch.float32)
        assert torch.isfinite(hist64).all() and torch.isfinite(buf64).all(), name
        assert torch.isfinite(hist32).all(), name
        if opts.get("zero_grads"):
            assert (buf64 == 0).all()
            decay = (1 - case["lr"] * case["weight_decay"]) ** torch.arange(1, STEPS + 1, dtype=torch.float64)
            expect = p0.double()[None] * decay[:, None, None]
            assert (hist64 - expect).abs().max().item() < 1e-12, "zero-grad case: decay only"
        d = update_discrepancy(p0, hist32, hist64)
        a = max_abs(hist32, hist64)
        note(f"muon coefficient_set={case['coefficient_set']}", d, name, a)
        note(f"muon group {group}", d, name, a)
        tensors[f"{name}.param"] = p0
        tensors[f"{name}.grads"] = grads
        tensors[f"{name}.expected"] = hist64.to(torch.float32).contiguous()
        tensors[f"{name}.momentum"] = buf64.to(torch.float32).contiguous()
        muon_json.append(case)

    # ---- Adam / AdamW ----
    adam = make_adam_cases()
    for case in adam:
        name = case["name"]
        p0, grads = make_param_and_grads(name, case["shape"])
        hist32, m32, v32 = adam_torch(case, p0, grads, torch.float32)
        hist64, m64, v64 = adam_torch(case, p0, grads, torch.float64)
        hand, mh, vh = adam_by_hand(case, p0, grads)
        assert (hist64 - hand).abs().max().item() < 1e-12, f"{name}: torch.optim fp64 vs by hand"
        assert (m64 - mh).abs().max().item() < 1e-12 and (v64 - vh).abs().max().item() < 1e-12
        assert update_discrepancy(p0, hist32, hand) < 1e-4, f"{name}: torch.optim fp32 vs by hand"
        note(f"adam family={case['family']}", update_discrepancy(p0, hist32, hist64), name,
             max_abs(hist32, hist64))
        tensors[f"{name}.param"] = p0
        tensors[f"{name}.grads"] = grads
        tensors[f"{name}.expected"] = hist32.contiguous()
        tensors[f"{name}.exp_avg"] = m32.contiguous()
        tensors[f"{name}.exp_avg_sq"] = v32.contiguous()

    # ---- Newton-Schulz alone ----
    ns = make_ns_cases()
    for case in ns:
        name = case["name"]
        x = torch.randn(*case["shape"], generator=generator_for(name), dtype=torch.float32)
        coeffs = COEFFICIENT_SETS[case["coefficient_set"]]
        rep = case["coefficient_set"] in REPEAT_LAST
        y64 = newton_schulz(x.double(), coeffs, case["ns_steps"], rep)
        y32 = newton_schulz(x, coeffs, case["ns_steps"], rep)
        note(f"ns coefficient_set={case['coefficient_set']} steps={case['ns_steps']}",
             rel_discrepancy(y32, y64), name, max_abs(y32, y64))
        tensors[f"{name}.input"] = x.contiguous()
        tensors[f"{name}.output"] = y64.to(torch.float32).contiguous()

    names = [c["name"] for c in muon_json] + [c["name"] for c in adam] + [c["name"] for c in ns]
    assert len(names) == len(set(names)), "duplicate case names"
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyz0123456789_") for n in names)
    for k, t in tensors.items():
        assert t.dtype == torch.float32 and t.is_contiguous() and torch.isfinite(t).all(), k

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    text = (
        "{\n"
        f'  "generator": "tools/golden/make_optim_golden.py",\n'
        f'  "torch_version": {json.dumps(torch.__version__)},\n'
        f'  "muon": {fmt_cases(muon_json)},\n'
        f'  "adam": {fmt_cases(adam)},\n'
        f'  "newton_schulz": {fmt_cases(ns)}\n'
        "}\n"
    )
    parsed = json.loads(text)
    assert [c["name"] for c in parsed["muon"]] == [c["name"] for c in muon_json]
    (out / "cases.json").write_text(text)
    # No safetensors metadata, so regenerated files are byte-identical.
    save_file(tensors, str(out / "optim_golden.safetensors"))

    back = load_file(str(out / "optim_golden.safetensors"))
    assert set(back) == set(tensors) and all(torch.equal(back[k], tensors[k]) for k in tensors)

    print(f"wrote {out}: {len(muon_json)} muon, {len(adam)} adam, {len(ns)} newton_schulz cases, "
          f"{len(tensors)} tensors")
    for f in ("cases.json", "optim_golden.safetensors"):
        print(f"  {f}: {(out / f).stat().st_size} bytes")
    print("fp32 vs fp64, per family: worst relative discrepancy max|a-b|/max|b| over the update")
    print("p_after - p_init (NS: over the output), the case it occurs in, and the worst max|a-b|")
    print("over the stored values themselves (parameters after each step; NS output):")
    for k in sorted(calib):
        rel, where, absd = calib[k]
        print(f"  {k:42s} rel {rel:.3e}  ({where})  abs {absd:.3e}")


if __name__ == "__main__":
    main()
