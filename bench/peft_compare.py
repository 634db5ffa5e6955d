#!/usr/bin/env python3
"""loraplex against HF PEFT on the same CPU, side by side in one run.

The same work on both: 8 adapters (rank 16, alpha 32, all seven projections,
no dropout), AdamW (lr 1e-4, no weight decay) with gradients clipped to norm
1, on the `small` preset model (written by loraplex-make-model, loaded by
transformers), one training step per adapter of 1 x 128 and of 8 x 128
random tokens. PEFT trains the adapters one after another, as a PEFT user
would (one PeftModel holding the 8 adapters, set_adapter, one optimizer
each); loraplex trains them in one co-batched step (loraplex-bench-train,
token budget 2048, the server's CPU default). For each thread count the two
alternate, round by round, and the ratio of the medians is printed:
loraplex's tokens/s over PEFT's. Next to it, the ceiling: PEFT's time over
the time the step's matmul FLOPs (as loraplex-bench-train counts them) take
at the peak fp32 GEMM rate measured in the same run, i.e. the ratio that a
step running every one of its FLOPs at peak GEMM speed, with nothing else
costing time, would reach. A goal above the ceiling cannot be met by
computing the same thing faster; only by computing less.

    .venv/bin/python bench/peft_compare.py [--build build] [--threads 1,2]
                                           [--rounds 3]

Needs torch, transformers and peft (tools/golden/requirements.txt pins the
versions the golden fixtures were made with).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import peft
import torch
import transformers

SLOTS = 8
RANK = 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
           "down_proj"]
SHAPES = [(1, 128), (8, 128)]  # (sequences per adapter, tokens per sequence)
BUDGET = 2048


def peft_model(model_dir):
    base = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32)
    base.requires_grad_(False)
    config = peft.LoraConfig(r=RANK, lora_alpha=32, lora_dropout=0.0,
                             target_modules=TARGETS, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, config, adapter_name="a0")
    for i in range(1, SLOTS):
        model.add_adapter(f"a{i}", config)
    optimizers = []
    for i in range(SLOTS):
        params = [p for n, p in model.named_parameters()
                  if f".a{i}." in n and "lora_" in n]
        assert params, f"no parameters of adapter a{i}"
        optimizers.append(torch.optim.AdamW(params, lr=1e-4,
                                            weight_decay=0.0))
    return model, optimizers


def peft_round(model, optimizers, batches):
    """One step of every adapter, one after another; seconds."""
    start = time.perf_counter()
    for i, (optimizer, ids) in enumerate(zip(optimizers, batches)):
        model.set_adapter(f"a{i}")
        # set_adapter makes only the active adapter trainable.
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(optimizer.param_groups[0]["params"],
                                       1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return time.perf_counter() - start


def loraplex_round(bench, threads):
    """loraplex-bench-train's co-batched step by shape: {shape: (seconds,
    the step's matmul GFLOP)}, and the peak fp32 GEMM GFLOP/s it measured."""
    out = subprocess.run(
        [bench, "--threads", str(threads), "--slots", str(SLOTS), "--rounds",
         "1", "--budgets", str(BUDGET), "--p1-only"],
        check=True, capture_output=True, text=True).stdout
    peak = re.search(r"^peak fp32 GEMM \(1024\^3\): ([0-9.]+) GFLOP/s", out,
                     re.MULTILINE)
    if not peak:
        sys.exit(f"no peak GEMM rate in:\n{out}")
    steps = {}
    for per_slot, seq in SHAPES:
        pattern = (rf"^{SLOTS} slots x {per_slot} x {seq} tokens, budget "
                   rf"{BUDGET}: co-batched ([0-9.]+) ms, .* ([0-9.]+) GFLOP/s$")
        match = re.search(pattern, out, re.MULTILINE)
        if not match:
            sys.exit(f"no co-batched time for {per_slot} x {seq} in:\n{out}")
        seconds = float(match.group(1)) / 1e3
        steps[(per_slot, seq)] = (seconds, float(match.group(2)) * seconds)
    return steps, float(peak.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bin_dir = os.path.join(args.build, "bin")
    bench = os.path.join(bin_dir, "loraplex-bench-train")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = os.path.join(tmp, "small")
        subprocess.run([os.path.join(bin_dir, "loraplex-make-model"),
                        "--preset", "small", "--seed", "0", "--out",
                        model_dir], check=True, capture_output=True)
        model, optimizers = peft_model(model_dir)
        vocab = model.config.vocab_size
        print(f"torch {torch.__version__}, transformers "
              f"{transformers.__version__}, peft {peft.__version__}")
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            generator = torch.Generator().manual_seed(0)
            batches = {shape: [torch.randint(0, vocab, shape,
                                             generator=generator)
                               for _ in range(SLOTS)] for shape in SHAPES}
            for shape in SHAPES:  # Warm-up.
                peft_round(model, optimizers, batches[shape])
            peft_times = {shape: [] for shape in SHAPES}
            ours = {shape: [] for shape in SHAPES}
            peaks = []
            gflop = {}
            for _ in range(args.rounds):
                steps, peak = loraplex_round(bench, threads)
                peaks.append(peak)
                for shape, (seconds, step_gflop) in steps.items():
                    ours[shape].append(seconds)
                    gflop[shape] = step_gflop
                for shape in SHAPES:
                    peft_times[shape].append(
                        peft_round(model, optimizers, batches[shape]))
            peak = statistics.median(peaks)
            for shape in SHAPES:
                a = statistics.median(ours[shape])
                b = statistics.median(peft_times[shape])
                at_peak = gflop[shape] / peak
                label = (f"{threads} thread(s), {SLOTS} adapters x "
                         f"{shape[0]} x {shape[1]} tokens")
                print(f"{label}: loraplex co-batched {a * 1e3:.1f} ms, PEFT "
                      f"one after another {b * 1e3:.1f} ms; "
                      f"{gflop[shape]:.1f} GFLOP, {at_peak * 1e3:.1f} ms at "
                      f"the peak GEMM rate ({peak:.1f} GFLOP/s)")
                results.append((label, b / a, b / at_peak))
    print("\nloraplex tokens/s over PEFT's (goal >= 1.5), and the ceiling:")
    for label, ratio, ceiling in results:
        print(f"  {label:<45} {ratio:6.2f}   ceiling {ceiling:5.2f}")


if __name__ == "__main__":
    main()
