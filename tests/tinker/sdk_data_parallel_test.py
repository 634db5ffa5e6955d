"""The official Tinker SDK, unmodified, against a data-parallel server.

Two real loraplex-server processes (Gloo on 127.0.0.1) with the base
sharded over them (--shard-base), and one process alone, both in fp64: a
training client's forward_backward (cross_entropy and importance_sampling),
optim_step, forward, save_state and a client restored from it with its
optimizer, and greedy sampling give the same losses, logprobs and tokens
on both.

Usage: sdk_data_parallel_test.py BIN_DIR
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

# fp64 on both sides: rows shared out over the ranks and summed agree far
# below this.
TOLERANCE = 1e-9


def next_tokens(types, tokens, **inputs):
    """A datum predicting each next token of `tokens`, with the loss's
    other per-position `inputs` (lists of floats)."""
    n = len(tokens) - 1
    loss_fn_inputs = {"target_tokens": types.TensorData(
        data=tokens[1:], dtype="int64", shape=[n])}
    for name, values in inputs.items():
        loss_fn_inputs[name] = types.TensorData(data=values, dtype="float32",
                                                shape=[n])
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs=loss_fn_inputs)


def datum(types, tokens):
    """Next-token prediction over `tokens`, every position weighted."""
    return next_tokens(types, tokens, weights=[1.0] * (len(tokens) - 1))


def rl_datum(types, tokens, advantage):
    n = len(tokens) - 1
    return next_tokens(
        types, tokens, logprobs=[-1.0 - 0.25 * i for i in range(n)],
        advantages=[advantage * (-1) ** i for i in range(n)])


def outputs(out):
    """The call's loss and every datum's logprobs, in order."""
    return [out.metrics["loss:sum"]] + [
        lp for o in out.loss_fn_outputs for lp in o["logprobs"].data]


def run(base_url):
    """The user's script; returns every number it saw and the greedy
    tokens."""
    import tinker
    from tinker import types

    client = tinker.ServiceClient(base_url=base_url, api_key="tml-local")
    training = client.create_lora_training_client(
        base_model="loraplex-tiny", rank=4, seed=3).result()
    # Three rows: two ranks do not split them evenly.
    batch = [datum(types, [5, 17, 33, 9, 41, 12, 7, 28]),
             datum(types, [3, 44, 21, 19, 2, 36, 50, 11, 8]),
             datum(types, [60, 61, 62])]
    rl = [rl_datum(types, [70, 71, 72, 73, 74], 0.5)]
    seen = []
    for _ in range(4):
        seen += outputs(training.forward_backward(batch,
                                                  "cross_entropy").result())
        seen += outputs(training.forward_backward(
            rl, "importance_sampling").result())
        training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    seen += outputs(training.forward(batch, "cross_entropy").result())
    state = training.save_state("dp").result()
    restored = client.create_training_client_from_state_with_optimizer(
        state.path).result()
    seen += outputs(restored.forward_backward(batch,
                                              "cross_entropy").result())
    restored.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    seen += outputs(restored.forward(batch, "cross_entropy").result())
    sampler = restored.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
    sample = sampler.sample(types.ModelInput.from_ints([5, 17, 33]),
                            num_samples=1, sampling_params=params).result()
    seen += list(sample.sequences[0].logprobs)
    client.close("success").result()
    return seen, list(sample.sequences[0].tokens)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    args = parser.parse_args()
    os.environ["TINKER_TELEMETRY"] = "0"
    work = tempfile.mkdtemp(prefix="loraplex-tinker-dp-")
    model = harness.make_tiny_model(args.bin_dir, work)
    flags = ["--dtype", "float64"]

    os.makedirs(os.path.join(work, "one"))
    one = harness.Server(args.bin_dir, os.path.join(work, "one"), model,
                         "loraplex-tiny", extra=flags)
    try:
        want, want_tokens = run(one.base_url)
    finally:
        one.stop()

    ranks = os.path.join(work, "ranks")
    os.makedirs(ranks)
    port = harness.free_port()
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), LORAPLEX_DIST_TIMEOUT_SECONDS="60")
    follower_log = open(os.path.join(ranks, "rank1.log"), "w")
    follower = subprocess.Popen(
        [os.path.join(args.bin_dir, "loraplex-server"), "--model", model,
         "--state-dir", os.path.join(ranks, "rank1-state"), "--threads", "1",
         "--shard-base", *flags],
        env=dict(env, RANK="1", LOCAL_RANK="1"), stdout=follower_log,
        stderr=subprocess.STDOUT)
    leader = harness.Server(args.bin_dir, ranks, model, "loraplex-tiny",
                            extra=flags + ["--shard-base"],
                            env=dict(env, RANK="0", LOCAL_RANK="0"))
    try:
        got, got_tokens = run(leader.base_url)
    finally:
        leader.stop()
        try:
            follower.wait(timeout=30)
        except subprocess.TimeoutExpired:
            follower.kill()
    assert "sharded over 2 ranks" in leader.log(), leader.log()
    assert len(got) == len(want), (len(got), len(want))
    worst = max(abs(g - w) for g, w in zip(got, want))
    print("largest difference from one process:", worst, "over", len(want),
          "values")
    assert worst <= TOLERANCE, worst
    assert all(math.isfinite(v) for v in got)
    assert got_tokens == want_tokens, (got_tokens, want_tokens)
    assert follower.returncode == 0, follower.returncode
    print("OK")


if __name__ == "__main__":
    main()
