"""The official OpenAI Python SDK (openai==3.63.0) against a real
loraplex-server's /v1 endpoints.

Starts `loraplex-server --http-listen` on loopback with the tiny model (byte
tokenizer) and a chat template written here, two tenants in a tokens file,
and checks, with the SDK exactly as a user calls it:

  - /v1/models lists the base model and the caller's adapters and jobs;
  - completions and chat completions, streamed and not, greedy, equal the
    native gRPC sampler's tokens and logprobs for the same weights and
    prompt (a chat prompt is the template rendered here with jinja2);
  - logprobs and top_logprobs, usage, finish_reason "length" / "stop";
  - an adapter trained by a job answers by jobs/{id} and adapters/{id};
  - concurrent requests for different weights equal each alone (greedy);
  - bad input is a 400 naming the parameter, a bad key a 401, another
    tenant's adapter a 404.

  python openai_sdk_test.py BUILD_BIN_DIR
"""

import concurrent.futures
import json
import math
import os
import sys
import tempfile
import urllib.error
import urllib.request

import jinja2
import openai

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tinker"))
import harness  # noqa: E402

import loraplex  # noqa: E402

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef01"
BASE = "loraplex-tiny"

# A template written for this test (ChatML-like markers).
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>"
            "{% endif %}")


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def close(a, b, what):
    check(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6),
          f"{what}: {a} != {b}")


def rendered_ids(messages):
    """The chat prompt's token ids: the byte tokenizer's bytes of the
    template rendered by jinja2 (no BOS: the template has none)."""
    text = jinja2.Template(TEMPLATE).render(messages=messages,
                                            add_generation_prompt=True)
    return list(text.encode())


def native(grpc_client, prompt, **weights):
    """The gRPC sampler's greedy sample: tokens, logprobs and OpenAI's
    finish_reason."""
    response = grpc_client.sample(prompt, max_tokens=12, temperature=0.0,
                                  top_logprobs=2, **weights)
    sample = response.samples[0]
    finish = ("length" if sample.stop_reason ==
              loraplex.v1.sampling_pb2.STOP_REASON_LENGTH else "stop")
    return list(sample.tokens), list(sample.logprobs), finish


def text_of(tokens):
    """The byte tokenizer's text of `tokens` (special ids skipped)."""
    return bytes(t for t in tokens if t < 256).decode("utf-8", "replace")


def main():
    bin_dir = sys.argv[1]
    work = tempfile.mkdtemp(prefix="loraplex-openai-")
    model = harness.make_tiny_model(bin_dir, work)
    with open(os.path.join(model, "chat_template.jinja"), "w") as f:
        f.write(TEMPLATE)
    tokens_file = os.path.join(work, "tokens.txt")
    with open(tokens_file, "w") as f:
        f.write(f"alice {ALICE}\nbob {BOB}\n")
    server = harness.Server(bin_dir, work, model, BASE, slots=2,
                            extra=["--tokens-file", tokens_file])
    try:
        run(server)
    finally:
        server.stop()
    print("openai_sdk_test: all checks passed")


def run(server):
    api = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=ALICE,
                        max_retries=0, timeout=300)
    grpc_client = loraplex.Client(server.grpc_address, token=ALICE)

    # /v1/models before any adapter: the base model alone.
    ids = [m.id for m in api.models.list().data]
    check(ids == [BASE], ids)

    # A completion, greedy, with logprobs: the gRPC sampler's answer.
    prompt = "the quick brown"
    got = api.completions.create(model=BASE, prompt=prompt, max_tokens=12,
                                 temperature=0, logprobs=2)
    choice = got.choices[0]
    tokens, logprobs, finish = native(grpc_client, prompt)
    check(choice.text == text_of(tokens), (choice.text, tokens))
    check(len(choice.logprobs.token_logprobs) == len(tokens), choice.logprobs)
    for a, b in zip(choice.logprobs.token_logprobs, logprobs):
        close(a, b, "completion logprob")
    check(all(len(top) <= 2 and len(top) >= 1
              for top in choice.logprobs.top_logprobs),
          choice.logprobs.top_logprobs)
    check(choice.finish_reason == finish, choice.finish_reason)
    check(got.usage.prompt_tokens == len(prompt) + 1, got.usage)  # + BOS
    check(got.usage.completion_tokens == len(tokens), got.usage)
    check(got.object == "text_completion" and got.model == BASE, got)

    # The same, streamed: the chunks add up to it; usage comes last.
    chunks = list(api.completions.create(
        model=BASE, prompt=prompt, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    check(text == choice.text, (text, choice.text))
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    check(reasons[-1] == finish and all(f is None for f in reasons[:-1]),
          reasons)
    check(chunks[-1].usage is not None and
          chunks[-1].usage.completion_tokens == len(tokens), chunks[-1])

    # A token-id prompt (BOS, then the bytes) is the text prompt; a stop
    # string ends the text before it ("stop"); a stop token id ends it.
    ids_prompt = [256] + list(prompt.encode())
    same = api.completions.create(model=BASE, prompt=ids_prompt,
                                  max_tokens=12, temperature=0)
    check(same.choices[0].text == choice.text, same.choices[0])
    ascii_at = [i for i, c in enumerate(choice.text) if i > 0 and
                c.isascii() and c.isprintable()]
    if ascii_at:
        stop = choice.text[ascii_at[0]]
        cut = api.completions.create(model=BASE, prompt=ids_prompt,
                                     max_tokens=12, temperature=0,
                                     stop=[stop])
        check(cut.choices[0].text == choice.text[:choice.text.index(stop)],
              (cut.choices[0].text, choice.text, stop))
        check(cut.choices[0].finish_reason == "stop", cut.choices[0])
    cut = api.completions.create(model=BASE, prompt=ids_prompt, max_tokens=12,
                                 temperature=0, logprobs=0,
                                 extra_body={"stop_token_ids": [tokens[2]]})
    check(cut.choices[0].finish_reason == "stop", cut.choices[0])
    check(len(cut.choices[0].logprobs.token_logprobs) ==
          tokens.index(tokens[2]) + 1, cut.choices[0].logprobs)
    drawn = api.completions.create(model=BASE, prompt=prompt, max_tokens=6,
                                   temperature=1.0, n=3, seed=11)
    check(len(drawn.choices) == 3 and
          [c.index for c in drawn.choices] == [0, 1, 2], drawn)
    again = api.completions.create(model=BASE, prompt=prompt, max_tokens=6,
                                   temperature=1.0, n=3, seed=11)
    check([c.text for c in again.choices] == [c.text for c in drawn.choices],
          "a seed repeats its samples")

    # Chat: the template rendered, then sampled; streamed equal to not.
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text",
                                              "text": "hello"}]}]
    flat = [messages[0], {"role": "user", "content": "hello"}]
    chat = api.chat.completions.create(model=BASE, messages=messages,
                                       max_tokens=12, temperature=0,
                                       logprobs=True, top_logprobs=3)
    message = chat.choices[0].message
    check(message.role == "assistant", message)
    tokens, logprobs, finish = native(grpc_client, rendered_ids(flat))
    check(message.content == text_of(tokens), (message.content, tokens))
    content = chat.choices[0].logprobs.content
    check(len(content) == len(tokens), content)
    for entry, token, logprob in zip(content, tokens, logprobs):
        check(entry.bytes == ([token] if token < 256 else []), (entry, token))
        close(entry.logprob, logprob, "chat logprob")
        check(len(entry.top_logprobs) == 3, entry)
    check(chat.usage.prompt_tokens == len(rendered_ids(flat)), chat.usage)
    check(chat.object == "chat.completion", chat)
    stream = list(api.chat.completions.create(
        model=BASE, messages=messages, max_tokens=12, temperature=0,
        stream=True))
    check(stream[0].choices[0].delta.role == "assistant", stream[0])
    streamed = "".join(c.choices[0].delta.content or "" for c in stream)
    check(streamed == message.content, (streamed, message.content))
    check(stream[-1].choices[0].finish_reason == finish, stream[-1])

    # An adapter trained by a job answers by jobs/{id} and adapters/{id},
    # as the native sampler does with it.
    data = os.path.join(server.work, "train.jsonl")
    with open(data, "w") as f:
        for i in range(16):
            f.write(json.dumps({"text": f"abc{i % 3} xyz " * 3}) + "\n")
    dataset = grpc_client.upload_dataset(data, name="abc")
    trained = []
    for seed in (1, 2):
        job = grpc_client.create_job(
            dataset, lora={"rank": 4}, optimizer={"lr": 2e-2},
            training={"max_steps": 12, "seq_len": 24, "batch_size": 2,
                      "seed": seed, "checkpoint_interval": 10})
        job = grpc_client.watch(job, progress=False)
        check(job.status == loraplex.v1.jobs_pb2.JOB_STATUS_SUCCEEDED, job)
        trained.append(job)
    ids = {m.id for m in api.models.list().data}
    for job in trained:
        check(job.name in ids and job.adapter in ids, (job, ids))
    # One model by its name (slashes and all), a checkpoint too.
    check(api.models.retrieve(BASE).id == BASE, "retrieve the base")
    got_model = api.models.retrieve(trained[0].adapter)
    check(got_model.id == trained[0].adapter and
          got_model.owned_by == "alice", got_model)
    checkpoints = grpc_client._call(
        grpc_client.jobs.ListCheckpoints,
        loraplex.v1.jobs_pb2.ListCheckpointsRequest(name=trained[0].name))
    check(len(checkpoints.checkpoints) > 0, checkpoints)
    name = checkpoints.checkpoints[0].name
    check(api.models.retrieve(name).id == name, name)
    answer = api.completions.create(model=name, prompt=prompt, max_tokens=4,
                                    temperature=0)
    check(answer.model == name and answer.choices[0].text is not None, answer)
    try:
        api.models.retrieve("adapters/nope")
        raise AssertionError("retrieved a model that does not exist")
    except openai.NotFoundError:
        pass
    job = trained[0]
    tokens, _, _ = native(grpc_client, prompt, job=job.name)
    for name in (job.name, job.adapter):
        answer = api.completions.create(model=name, prompt=prompt,
                                        max_tokens=12, temperature=0)
        check(answer.choices[0].text == text_of(tokens),
              (name, answer.choices[0].text, tokens))

    # Concurrent requests for different weights, each as it is alone.
    names = [BASE, trained[0].adapter, trained[1].adapter, trained[0].name]
    alone = {name: api.completions.create(
        model=name, prompt=prompt, max_tokens=16, temperature=0,
        logprobs=1).choices[0] for name in names}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [(name, pool.submit(
            api.completions.create, model=name, prompt=prompt, max_tokens=16,
            temperature=0, logprobs=1)) for name in names * 2]
        for name, future in futures:
            got = future.result().choices[0]
            check(got.text == alone[name].text, (name, got.text))
            for a, b in zip(got.logprobs.token_logprobs,
                            alone[name].logprobs.token_logprobs):
                close(a, b, f"{name} together vs alone")

    # Errors in OpenAI's shape.
    def expect(error_type, param, **kwargs):
        try:
            api.completions.create(**{"model": BASE, "prompt": "x",
                                      "max_tokens": 2, **kwargs})
        except error_type as error:
            check(error.param == param, (param, error.body))
            return error
        raise AssertionError(f"{kwargs} was accepted")

    expect(openai.BadRequestError, "temperature", temperature=5)
    expect(openai.BadRequestError, "presence_penalty", presence_penalty=0.5)
    expect(openai.BadRequestError, "echo", echo=True)
    expect(openai.BadRequestError, "mirostat", extra_body={"mirostat": 1})
    expect(openai.NotFoundError, "model", model="adapters/nope")
    expect(openai.NotFoundError, "model", model="no-such-model")
    try:
        api.chat.completions.create(
            model=BASE, max_tokens=2,
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "x"}}]}])
        raise AssertionError("an image part was accepted")
    except openai.BadRequestError as error:
        check(error.param == "messages[0].content[0].type", error.body)
    # A body nested 100,000 levels deep is refused, and the server lives.
    deep = ('{"model": "%s", "prompt": "x", "n": %s%s}'
            % (BASE, "[" * 100000, "]" * 100000)).encode()
    request = urllib.request.Request(
        f"{server.base_url}/v1/completions", data=deep, method="POST",
        headers={"Authorization": f"Bearer {ALICE}",
                 "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=60)
        raise AssertionError("a deeply nested body was accepted")
    except urllib.error.HTTPError as error:
        check(error.code == 400, error.code)
        body = json.loads(error.read())
        check("deeper than" in body["error"]["message"], body)
    check([m.id for m in api.models.list().data][0] == BASE, "still serving")
    bad_key = openai.OpenAI(base_url=f"{server.base_url}/v1",
                            api_key="not-a-token", max_retries=0)
    try:
        bad_key.models.list()
        raise AssertionError("a bad key was accepted")
    except openai.AuthenticationError:
        pass
    # Another tenant neither sees nor samples alice's adapters.
    bob = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=BOB,
                        max_retries=0)
    check([m.id for m in bob.models.list().data] == [BASE], "bob's models")
    try:
        bob.completions.create(model=trained[0].adapter, prompt="x",
                               max_tokens=2)
        raise AssertionError("bob sampled alice's adapter")
    except openai.NotFoundError:
        pass
    grpc_client.close()


if __name__ == "__main__":
    main()
