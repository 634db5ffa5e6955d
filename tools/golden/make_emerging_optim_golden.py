#!/usr/bin/env python3
"""Golden steps of NVIDIA Emerging-Optimizers' own optimizer classes.

What it produces
----------------
``tests/fixtures/golden/emerging/`` (or ``--out``):

* ``cases.json``: every case with its hyper-parameters and the package's
  version::

    {"generator": "tools/golden/make_emerging_optim_golden.py",
     "emerging_optimizers_version": "...", "torch_version": "...",
     "lion": [{"name", "shape": [...], "lr", "betas": [b1, b2],
               "weight_decay", "steps"}, ...],
     "soap": [{"name", "shape": [m, n], "lr", "betas": [b1, b2],
               "shampoo_beta", "eps", "weight_decay", "nesterov",
               "correct_bias", "use_eigh", "power_iter_steps",
               "max_update_rms", "steps"}, ...]}

* ``emerging_golden.safetensors``, float64: ``<name>.param`` the initial
  parameter, ``<name>.grads`` [steps, ...] the gradient of each step,
  ``<name>.expected`` [steps, ...] the parameter after each step and
  ``<name>.exp_avg`` the state after the last step.

  SOAP cases add the state after each step of the same run, [steps, ...]:
  ``<name>.exp_avg``, ``<name>.exp_avg_sq`` (the Adam moments, in the
  eigenbasis), ``<name>.kronecker_left`` / ``<name>.kronecker_right`` (L, R)
  and ``<name>.eigenbasis_left`` / ``<name>.eigenbasis_right`` (Q_L, Q_R),
  so a test can start any step from the reference's own state; and
  ``<name>.expected_fp32``, float32, the parameter after each step of the
  package as shipped on a float32 copy of the parameter and gradients.

How
---
Each case builds the package's own optimizer (``emerging_optimizers.
scalar_optimizers.Lion``, its default decoupled weight decay) on one float64
parameter and steps it with the given gradients. The C++ optimizers are
checked against these steps (tests/core/lion_test.cc), in float64.

``emerging_optimizers.soap.SOAP`` keeps its state and does its arithmetic in
float32 whatever the parameter's dtype (``p.grad.to(torch.float32)``, float32
moments, Kronecker factors and eigenbases from the default dtype). Its first
step is sign-like in the eigenbasis (m̂/(√v̂ + eps) with v̂ = m̂²), so
entries that are zero in exact arithmetic (off the diagonal of Q_Lᵀ·g·Q_R at
step 1) and come out as float32 rounding noise (~1e-7) are amplified to
updates of about lr: a float32 run is a reproduction of its rounding, not of
its algorithm. So each SOAP case is run twice: ``expected`` (and the states)
by the package's own code with its two float32 casts redirected to float64
and float64 as the default dtype (every operation is still the package's;
the amplified noise is then ~1e-16/eps = 1e-8 of a step), and
``expected_fp32`` by the package as shipped. Even in float64, a
rank-deficient Kronecker factor (R of a LoRA A gradient, L of a B one, until
enough steps have filled it) has an eigenbasis on its null space that only
rounding decides, and the next step's orthogonal iteration starts from it:
a one-ulp change of the gradients moves later steps by about a step. That is
why every step's state is stored: tests/core/soap_test.cc starts each step
from the reference's own state, and runs whole trajectories only where the
factors are full rank from step 1 (square cases).

Running it
----------
The package is on PyPI as ``emerging-optimizers`` (0.3.0 here). It declares
Python >= 3.12 and uses ``typing.override``; on Debian 12's Python 3.11 it
is installed (with its one dependency, ``absl-py``) by ``pip install
--no-deps --ignore-requires-python emerging-optimizers==0.3.0 absl-py`` and
this script supplies ``typing.override`` from ``typing_extensions``. Its update functions are ``torch.compile``d;
TorchDynamo is disabled here so they run eagerly (the same operations,
without a compiler toolchain).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402

if not hasattr(typing, "override"):  # Python < 3.12.
    import typing_extensions

    typing.override = typing_extensions.override

import types  # noqa: E402

import emerging_optimizers  # noqa: E402
from emerging_optimizers.scalar_optimizers import Lion  # noqa: E402
from emerging_optimizers.soap import soap as soap_module  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "fixtures", "golden", "emerging"))

LION_CASES = [
    # LoRA A and B matrices, a vector, a 3-D tensor.
    {"name": "lion_lora_a", "shape": [4, 32], "lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.0, "steps": 4},
    {"name": "lion_square", "shape": [8, 8], "lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.0, "steps": 3},
    {"name": "lion_lora_b", "shape": [32, 4], "lr": 3e-4, "betas": [0.9, 0.99], "weight_decay": 0.1, "steps": 4},
    {"name": "lion_vector", "shape": [16], "lr": 1e-2, "betas": [0.95, 0.98], "weight_decay": 0.01, "steps": 3},
    {"name": "lion_cube", "shape": [2, 3, 5], "lr": 2e-3, "betas": [0.5, 0.9], "weight_decay": 0.5, "steps": 3},
    # beta1 0: the sign of the gradient alone; beta2 0: m is the last gradient.
    {"name": "lion_beta1_zero", "shape": [8, 8], "lr": 1e-3, "betas": [0.0, 0.99], "weight_decay": 0.0, "steps": 3},
    {"name": "lion_beta2_zero", "shape": [8, 8], "lr": 1e-3, "betas": [0.9, 0.0], "weight_decay": 0.0, "steps": 3},
    # Zero gradients at step 2: sign(β1·m) of the momentum alone.
    {"name": "lion_zero_grad", "shape": [6, 4], "lr": 1e-3, "betas": [0.9, 0.99], "weight_decay": 0.05, "steps": 3,
     "zero_steps": [1]},
]

# The package's defaults but for lr (which it has none of) and weight decay.
SOAP_DEFAULTS = {"lr": 1e-2, "betas": [0.9, 0.95], "shampoo_beta": 0.95, "eps": 1e-8, "weight_decay": 0.0,
                 "nesterov": False, "correct_bias": True, "use_eigh": False, "power_iter_steps": 1,
                 "max_update_rms": 0.0, "steps": 8}
SOAP_CASES = [dict(SOAP_DEFAULTS, **case) for case in [
    # LoRA A [r, in] and B [out, r]: R (resp. L) is rank-deficient for the first steps. 0.3.0 refreshes the
    # eigenbasis at every step (no precondition frequency): eigh at step 1, orthogonal iteration after.
    {"name": "soap_lora_a", "shape": [4, 24]},
    {"name": "soap_lora_b", "shape": [24, 4], "weight_decay": 0.01},
    {"name": "soap_square", "shape": [8, 8], "weight_decay": 0.1, "lr": 3e-3},
    # eigh at every step; two rounds of orthogonal iteration per step.
    {"name": "soap_use_eigh", "shape": [6, 10], "use_eigh": True, "steps": 6},
    {"name": "soap_power_iter", "shape": [10, 6], "power_iter_steps": 2, "steps": 6},
    {"name": "soap_nesterov", "shape": [8, 12], "nesterov": True, "weight_decay": 0.01, "steps": 6},
    # No bias correction (Adam's nor the Kronecker factors'), other betas.
    {"name": "soap_no_bias_correction", "shape": [8, 8], "correct_bias": False, "betas": [0.8, 0.99],
     "shampoo_beta": 0.9, "steps": 6},
    # Update RMS clipped to 0.3 (an unclipped update's RMS is about 1).
    {"name": "soap_clip", "shape": [12, 8], "max_update_rms": 0.3, "steps": 6},
    # A zero gradient at step 3 (the factors decay, the moments carry the step), a larger eps.
    {"name": "soap_zero_grad", "shape": [6, 4], "eps": 1e-6, "weight_decay": 0.05, "steps": 6, "zero_steps": [2]},
]]


# The C++ state's names for the package's.
SOAP_STATE_KEYS = {"exp_avg": "exp_avg", "exp_avg_sq": "exp_avg_sq", "kronecker_left": "L",
                   "kronecker_right": "R", "eigenbasis_left": "Q_L", "eigenbasis_right": "Q_R"}


class _TorchWithFloat64For32(types.ModuleType):
    """``torch`` with ``float32`` meaning float64, for soap.py's two casts."""

    def __getattr__(self, name: str):
        return torch.float64 if name == "float32" else getattr(torch, name)


def run_soap(case: dict, param: torch.Tensor, grads: torch.Tensor, float64: bool):
    p = torch.nn.Parameter(param.clone())
    default_dtype = torch.get_default_dtype()
    if float64:
        soap_module.torch = _TorchWithFloat64For32("torch")
        torch.set_default_dtype(torch.float64)
    try:
        optimizer = soap_module.SOAP(
            [p], lr=case["lr"], betas=tuple(case["betas"]), shampoo_beta=case["shampoo_beta"], eps=case["eps"],
            weight_decay=case["weight_decay"], nesterov=case["nesterov"], correct_bias=case["correct_bias"],
            use_eigh=case["use_eigh"], power_iter_steps=case["power_iter_steps"],
            max_update_rms=case["max_update_rms"])
        expected = []
        states: dict[str, list[torch.Tensor]] = {key: [] for key in SOAP_STATE_KEYS}
        for step in range(case["steps"]):
            p.grad = grads[step].clone()
            optimizer.step()
            expected.append(p.detach().clone())
            for key, ours in SOAP_STATE_KEYS.items():
                states[key].append(optimizer.state[p][ours].clone())
    finally:
        soap_module.torch = torch
        torch.set_default_dtype(default_dtype)
    if float64:
        assert all(state[-1].dtype == torch.float64 for state in states.values())
    return torch.stack(expected), {key: torch.stack(value) for key, value in states.items()}


def soap_case(case: dict, generator: torch.Generator) -> dict[str, torch.Tensor]:
    shape = case["shape"]
    steps = case["steps"]
    param = torch.randn(shape, generator=generator, dtype=torch.float64)
    grads = torch.randn([steps, *shape], generator=generator, dtype=torch.float64)
    for step in case.get("zero_steps", []):
        grads[step].zero_()
    expected, states = run_soap(case, param, grads, float64=True)
    expected_fp32, _ = run_soap(case, param.float(), grads.float(), float64=False)
    name = case["name"]
    tensors = {
        f"{name}.param": param,
        f"{name}.grads": grads,
        f"{name}.expected": expected,
        f"{name}.expected_fp32": expected_fp32,
    }
    tensors.update({f"{name}.{key}": value for key, value in states.items()})
    return tensors


def lion_case(case: dict, generator: torch.Generator) -> dict[str, torch.Tensor]:
    shape = case["shape"]
    steps = case["steps"]
    param = torch.randn(shape, generator=generator, dtype=torch.float64)
    grads = torch.randn([steps, *shape], generator=generator, dtype=torch.float64)
    for step in case.get("zero_steps", []):
        grads[step].zero_()
    p = torch.nn.Parameter(param.clone())
    optimizer = Lion([p], lr=case["lr"], betas=tuple(case["betas"]), weight_decay=case["weight_decay"])
    expected = []
    for step in range(steps):
        p.grad = grads[step].clone()
        optimizer.step()
        expected.append(p.detach().clone())
    name = case["name"]
    return {
        f"{name}.param": param,
        f"{name}.grads": grads,
        f"{name}.expected": torch.stack(expected),
        f"{name}.exp_avg": optimizer.state[p]["exp_avg"].clone(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    generator = torch.Generator().manual_seed(4812)
    tensors: dict[str, torch.Tensor] = {}
    for case in LION_CASES:
        tensors.update(lion_case(case, generator))
    # After the Lion cases, so theirs stay the same.
    for case in SOAP_CASES:
        tensors.update(soap_case(case, generator))
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(args.out, "emerging_golden.safetensors"))
    cases = {
        "generator": "tools/golden/make_emerging_optim_golden.py",
        "emerging_optimizers_version": emerging_optimizers.__version__,
        "torch_version": torch.__version__,
        "lion": LION_CASES,
        "soap": SOAP_CASES,
    }
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    print(f"wrote {len(LION_CASES)} Lion and {len(SOAP_CASES)} SOAP cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
