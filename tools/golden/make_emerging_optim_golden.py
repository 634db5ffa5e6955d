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
               "weight_decay", "steps"}, ...]}

* ``emerging_golden.safetensors``, float64: ``<name>.param`` the initial
  parameter, ``<name>.grads`` [steps, ...] the gradient of each step,
  ``<name>.expected`` [steps, ...] the parameter after each step and
  ``<name>.exp_avg`` the state after the last step.

How
---
Each case builds the package's own optimizer (``emerging_optimizers.
scalar_optimizers.Lion``, its default decoupled weight decay) on one float64
parameter and steps it with the given gradients. The C++ optimizers are
checked against these steps (tests/core/lion_test.cc), in float64.

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

import emerging_optimizers  # noqa: E402
from emerging_optimizers.scalar_optimizers import Lion  # noqa: E402
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
    save_file({k: v.contiguous() for k, v in tensors.items()},
              os.path.join(args.out, "emerging_golden.safetensors"))
    cases = {
        "generator": "tools/golden/make_emerging_optim_golden.py",
        "emerging_optimizers_version": emerging_optimizers.__version__,
        "torch_version": torch.__version__,
        "lion": LION_CASES,
    }
    with open(os.path.join(args.out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    print(f"wrote {len(LION_CASES)} Lion cases to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
