"""The official Tinker SDK (tinker==0.38.0) drives a real loraplex-server.

Starts `loraplex-server --http-listen` on loopback with a fresh tiny model
and runs a supervised loop through the SDK exactly as a Tinker user writes
it: a LoRA training client, forward_backward with cross_entropy,
optim_step, save_state, save_weights_and_get_sampling_client, sample,
compute_logprobs, and a training client restored from the saved state with
its optimizer. Asserts the loss falls, the sampler sees the trained
weights, and the restored client continues where the first stopped.

  python sdk_supervised_test.py BUILD_BIN_DIR [--trace FILE]

--trace writes every HTTP request the SDK sent (method, path, headers that
matter, body) as JSON lines, the input of the C++ replay test.
"""

import argparse
import base64
import json
import math
import os
import subprocess
import re
import tempfile
import time
import urllib.request

import harness


def install_trace(path):
    """Records each request httpx sends (the SDK's transport) with its
    response, one JSON line each, in the order they were sent."""
    import httpx
    out = open(path, "w")
    original = httpx.AsyncClient.send

    def b64(data):
        return base64.b64encode(data).decode()

    async def send(self, request, *args, **kwargs):
        record = {
            "method": request.method,
            "path": request.url.path,
            "content_type": request.headers.get("content-type", ""),
            "accept": request.headers.get("accept", ""),
            "body": b64(request.content),
        }
        response = await original(self, request, *args, **kwargs)
        await response.aread()
        record["status"] = response.status_code
        record["response_type"] = response.headers.get("content-type", "")
        record["response"] = b64(response.content)
        out.write(json.dumps(record) + "\n")
        out.flush()
        return response

    httpx.AsyncClient.send = send


def scrape(base_url):
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain"), \
            reply.headers
        return reply.read().decode()


def check_job_metrics(bin_dir, work, base_url, grpc_address):
    """A job started with the CLI shows in /metrics while it runs."""
    cli = [os.path.join(bin_dir, "loraplex"), "--server", grpc_address,
           "--json"]
    data = os.path.join(work, "train.jsonl")
    with open(data, "w") as f:
        for i in range(16):
            f.write(json.dumps({"text": f"metrics line {i} " * 3}) + "\n")
    dataset = json.loads(subprocess.run(
        cli + ["datasets", "upload", data, "--name", "metrics"], check=True,
        capture_output=True, text=True).stdout)
    job = json.loads(subprocess.run(
        cli + ["jobs", "create", "--dataset", dataset["name"], "--max-steps",
               "100000", "--seq-len", "32", "--rank", "2"], check=True,
        capture_output=True, text=True).stdout)
    job_id = job["name"].split("/")[-1]
    pattern = re.compile(
        r'^loraplex_job_step\{tenant="default",job="' + re.escape(job_id) +
        r'"\} (\d+)$', re.M)
    deadline = time.time() + 120
    while True:
        text = scrape(base_url)
        found = pattern.search(text)
        if found and int(found.group(1)) >= 2:
            break
        assert time.time() < deadline, text
        time.sleep(0.2)
    for family in ("loraplex_job_loss", "loraplex_job_lr",
                   "loraplex_job_grad_norm",
                   "loraplex_job_tokens_per_second"):
        assert f'{family}{{tenant="default",job="{job_id}"}}' in text, family
    assert 'loraplex_jobs{status="running"} 1' in text, text
    subprocess.run(cli + ["jobs", "cancel", job_id], check=True,
                   capture_output=True)


def rl_rewards(client, types, optimizer, step_params, loss_fn, iterations):
    """The RL loop as a Tinker user writes it: sample one-token answers from
    the current policy, reward digits, update on group-centred advantages.
    Digits are 10 of the byte tokenizer's 259 ids. Returns the mean reward
    per iteration."""
    training = client.create_lora_training_client(
        base_model="loraplex-tiny", rank=4, seed=11,
        optimizer=optimizer).result()
    prompt = list(b"Answer with a digit: ")
    rewards = []
    for i in range(iterations):
        sampler = training.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=1, temperature=1.0,
                                      seed=1000 + i, stop=[])
        result = sampler.sample(types.ModelInput.from_ints(prompt),
                                num_samples=16, sampling_params=params).result()
        answers = [(seq.tokens[0], seq.logprobs[0]) for seq in result.sequences]
        reward = [1.0 if ord("0") <= t <= ord("9") else 0.0 for t, _ in answers]
        mean = sum(reward) / len(reward)
        rewards.append(mean)
        data = []
        for (token, logprob), r in zip(answers, reward):
            n = len(prompt)
            # Only the answer is scored: the prompt has advantage 0.
            data.append(types.Datum(
                model_input=types.ModelInput.from_ints(prompt),
                loss_fn_inputs={
                    "target_tokens": types.TensorData(
                        data=prompt[1:] + [token], dtype="int64", shape=[n]),
                    "logprobs": types.TensorData(
                        data=[0.0] * (n - 1) + [logprob], dtype="float32",
                        shape=[n]),
                    "advantages": types.TensorData(
                        data=[0.0] * (n - 1) + [(r - mean) / 16],
                        dtype="float32", shape=[n]),
                }))
        out = training.forward_backward(data, loss_fn).result()
        assert "loss:sum" in out.metrics, out.metrics
        training.optim_step(step_params).result()
    return rewards


def datum(types, tokens):
    """Next-token prediction over `tokens`, every position weighted."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(
                data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]),
            "weights": types.TensorData(
                data=[1.0] * (len(tokens) - 1), dtype="float32",
                shape=[len(tokens) - 1]),
        })


def total_loss(output):
    return output.metrics["loss:sum"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("--trace")
    args = parser.parse_args()
    os.environ["TINKER_TELEMETRY"] = "0"
    if args.trace:
        install_trace(args.trace)

    import tinker
    from tinker import types

    work = tempfile.mkdtemp(prefix="loraplex-tinker-")
    server = harness.Server(args.bin_dir, work,
                            harness.make_tiny_model(args.bin_dir, work),
                            "loraplex-tiny")
    base_url, grpc_address = server.base_url, server.grpc_address
    try:
        client = tinker.ServiceClient(base_url=base_url, api_key="tml-local")
        caps = client.get_server_capabilities()
        assert [m.model_name for m in caps.supported_models] == \
            ["loraplex-tiny"], caps

        training = client.create_lora_training_client(
            base_model="loraplex-tiny", rank=4, seed=3).result()
        info = training.get_info()
        assert info.model_data.model_name == "loraplex-tiny", info
        assert info.lora_rank == 4, info

        batch = [datum(types, [5, 17, 33, 9, 41, 12, 7, 28]),
                 datum(types, [3, 44, 21, 19, 2, 36, 50, 11, 8])]
        positions = sum(len(d.loss_fn_inputs["weights"].data) for d in batch)
        started = time.time()
        losses = []
        for step in range(8):
            fwdbwd = training.forward_backward(batch, "cross_entropy")
            optim = training.optim_step(types.AdamParams(learning_rate=2e-2))
            out = fwdbwd.result()
            optim.result()
            losses.append(total_loss(out))
            # The loss is the SUM of -logprob over weighted targets.
            logprobs = [lp for o in out.loss_fn_outputs
                        for lp in o["logprobs"].data]
            assert len(logprobs) == positions, len(logprobs)
            assert math.isclose(-sum(logprobs), losses[-1], rel_tol=1e-4), \
                (sum(logprobs), losses[-1])
        print("losses", [round(x, 4) for x in losses])
        assert losses[-1] < 0.5 * losses[0], losses

        # The session's slot and steps are in /metrics.
        text = scrape(base_url)
        assert 'loraplex_slots{state="busy"} 1' in text, text
        assert re.search(r'^loraplex_session_step\{tenant="default",'
                         r'session="[^"]+",slot="\d+"\} 8$', text, re.M), text
        stepped = re.search(r'^loraplex_session_last_step_timestamp_seconds'
                            r'\{tenant="default",session="[^"]+",slot="\d+"\}'
                            r' (\S+)$', text, re.M)
        assert stepped and started - 1 <= float(stepped.group(1)) <= \
            time.time() + 1, (started, stepped and stepped.group(1))
        # The SDK's calls, counted by route and status.
        assert re.search(r'^loraplex_requests_total\{transport="http",'
                         r'method="/api/v1/forward_backward",code="200"\} '
                         r'(?:[89]|\d\d+)$', text, re.M), text
        check_job_metrics(args.bin_dir, work, base_url, grpc_address)

        # A forward-only pass sees the trained weights and changes nothing.
        forward = training.forward(batch, "cross_entropy").result()
        assert total_loss(forward) < losses[0]

        state = training.save_state("after-8").result()
        assert state.path.startswith("tinker://") and \
            state.path.endswith("/weights/after-8"), state.path

        sampler = training.save_weights_and_get_sampling_client().result()
        prompt = types.ModelInput.from_ints([5, 17, 33])
        params = types.SamplingParams(max_tokens=5, temperature=0.0, stop=[])
        sample = sampler.sample(prompt, num_samples=2,
                                sampling_params=params).result()
        assert len(sample.sequences) == 2
        for seq in sample.sequences:
            assert seq.stop_reason == "length", seq.stop_reason
            assert len(seq.tokens) == 5 and len(seq.logprobs) == 5
        # Greedy from the trained adapter continues the trained text.
        assert list(sample.sequences[0].tokens[:2]) == [9, 41], \
            sample.sequences[0].tokens
        logprobs = sampler.compute_logprobs(
            types.ModelInput.from_ints([5, 17, 33, 9, 41])).result()
        assert logprobs[0] is None and len(logprobs) == 5, logprobs
        assert all(lp is not None and lp < 0 for lp in logprobs[1:])

        base = client.create_sampling_client(
            base_model="loraplex-tiny").result()
        base_lp = base.compute_logprobs(
            types.ModelInput.from_ints([5, 17, 33, 9, 41])).result()
        assert sum(base_lp[1:]) < sum(logprobs[1:]), (base_lp, logprobs)

        # Restored with its optimizer: the next step equals the first
        # client's next step.
        restored = client.create_training_client_from_state_with_optimizer(
            state.path).result()
        a = training.forward_backward(batch, "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        b = restored.forward_backward(batch, "cross_entropy")
        restored.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        la, lb = total_loss(a.result()), total_loss(b.result())
        assert math.isclose(la, lb, rel_tol=1e-6), (la, lb)
        assert math.isclose(la, total_loss(forward), rel_tol=1e-6)
        after_a = training.forward(batch, "cross_entropy").result()
        after_b = restored.forward(batch, "cross_entropy").result()
        assert math.isclose(total_loss(after_a), total_loss(after_b),
                            rel_tol=1e-6)

        # RL through the SDK: importance sampling with AdamW, PPO with
        # loraplex's Muon (Tinker's "dimuon" optimizer type).
        for name, optimizer, params, loss_fn in (
                ("adamw", None, types.AdamParams(learning_rate=2e-2),
                 "importance_sampling"),
                ("muon", types.DimuonOptimizerConfig(),
                 types.DimuonParams(learning_rate=5e-2), "ppo")):
            # A recording keeps the trace small: its replay checks the
            # protocol, not the learning.
            iterations = 4 if args.trace else 30
            rewards = rl_rewards(client, types, optimizer, params, loss_fn,
                                 iterations)
            last = sum(rewards[-5:]) / len(rewards[-5:])
            print(name, loss_fn, "reward", rewards[0], "->", last)
            assert args.trace or (rewards[0] < 0.25 and last > 0.6), \
                (name, rewards)

        # A user error is reported, not retried for ever.
        try:
            client.create_lora_training_client(base_model="other-model",
                                               rank=4).result()
        except Exception as error:
            # The SDK wraps the 400 (BadRequestError) it got.
            chain = f"{error} {error.__cause__} {error.__context__}"
            assert "base_model" in chain, chain
        else:
            raise AssertionError("a wrong base_model was accepted")
        # Ends the session (sessions/{id}/finish), freeing its slots.
        client.close("success").result()
        print("OK")
    except BaseException:
        import traceback
        traceback.print_exc()
        raise
    finally:
        server.stop()


if __name__ == "__main__":
    main()
