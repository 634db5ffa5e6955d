#!/usr/bin/env python3
"""The real server on a Qwen3 directory, end to end, against transformers.

A tiny random Qwen3 checkpoint made with transformers' own classes
(Qwen3Config / Qwen3ForCausalLM: one layer, hidden size 16, Qwen's padded
151,936 embedding rows, tied) is saved beside a real tokenizer, Qwen2's
151k-token vocabulary that transformers converts from the vocabulary-only
GGUF file, and the real Qwen3 chat template (Qwen-Qwen3-0.6B.jinja), both
fetched by deploy/setup.sh from PyPI's llama-cpp-python source
distribution (never committed). On that directory:

* `loraplex-server` takes a multi-turn chat dataset whose assistant
  messages carry reasoning_content, uploaded with the real CLI (`loraplex
  datasets upload`): the template drops past reasoning, so each
  conversation becomes one example per assistant turn;
* a job over it trains to SUCCEEDED;
* `loraplex sample --messages` on the job renders the prompt exactly as
  transformers' apply_chat_template(add_generation_prompt=True) does, with
  and without --chat-template-kwargs '{"enable_thinking": false}', and the
  two prompts differ as transformers' do.

A missing fetched file fails the test, saying that deploy/setup.sh
fetches it.

    qwen3_server_test.py BIN_DIR TEMPLATES_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "tinker"))

import harness  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    Qwen3Config,
    Qwen3ForCausalLM,
)

REAL_VOCAB = "ggml-vocab-qwen2.gguf"
QWEN3_TEMPLATE = "Qwen-Qwen3-0.6B.jinja"
# Qwen pads its embedding rows past the tokenizer's to this many.
QWEN_ROWS = 151936

CONVERSATIONS = [
    [{"role": "user", "content": f"Count to {n}."},
     {"role": "assistant", "reasoning_content": "Count up from one.",
      "content": ", ".join(str(i) for i in range(1, n + 1)) + "."},
     {"role": "user", "content": "Again, backwards."},
     {"role": "assistant", "reasoning_content": "Reverse it.",
      "content": ", ".join(str(i) for i in range(n, 0, -1)) + "."}]
    for n in range(2, 6)
]
PROMPT = [{"role": "system", "content": "You count."},
          {"role": "user", "content": "Count to 3."}]


def fetched(templates_dir: Path, name: str) -> Path:
    path = templates_dir / name
    if not path.exists():
        sys.exit(f"FAIL: {path} is missing: deploy/setup.sh fetches it "
                 "(tools/fetch_published_templates.py)")
    return path


def make_model(templates_dir: Path, out: Path):
    """The Qwen3 directory; returns transformers' tokenizer of it."""
    vocab = fetched(templates_dir, REAL_VOCAB)
    template = fetched(templates_dir, QWEN3_TEMPLATE).read_text(
        encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(str(templates_dir),
                                        gguf_file=vocab.name)
    tok.save_pretrained(str(out))
    # Saved again, tokenizer.json carries Qwen2's NFC normalizer (as in
    # published_templates_test.py).
    AutoTokenizer.from_pretrained(str(out)).save_pretrained(str(out))
    # The real Qwen3 template, and no other the conversion may have kept.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config, indent=2))
    (out / "chat_template.json").unlink(missing_ok=True)
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(str(out))
    if tok.chat_template != template:
        sys.exit("FAIL: transformers does not see the Qwen3 template")

    rows = max(QWEN_ROWS, (len(tok) + 127) // 128 * 128)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=rows, hidden_size=16, intermediate_size=32,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=8, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    Qwen3ForCausalLM(config).save_pretrained(str(out))
    return tok


def cli(bin_dir: Path, server, *args: str) -> dict:
    run = subprocess.run(
        [str(bin_dir / "loraplex"), "--server", server.grpc_address,
         "--json", *args], capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        sys.exit(f"FAIL: loraplex {' '.join(args)}: exit {run.returncode}\n"
                 f"{run.stderr}\n{server.log()}")
    return json.loads(run.stdout)


def hf_prompt_ids(tok, **kwargs) -> list[int]:
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True,
                                  tokenize=True, **kwargs)
    if not isinstance(ids, list):  # transformers 5: a BatchEncoding.
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def main() -> int:
    bin_dir, templates_dir = Path(sys.argv[1]), Path(sys.argv[2])
    failures = []

    def check(condition, message):
        if not condition:
            failures.append(message)
            print("FAIL:", message)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "qwen3"
        tok = make_model(templates_dir, model)
        (work / "server").mkdir()
        server = harness.Server(str(bin_dir), str(work / "server"),
                                str(model), "qwen3-tiny", slots=1)
        try:
            data = work / "chat.jsonl"
            data.write_text("".join(json.dumps({"messages": c}) + "\n"
                                    for c in CONVERSATIONS))
            dataset = cli(bin_dir, server, "datasets", "upload", str(data),
                          "--name", "qwen3-reasoning")
            # The template drops past reasoning: one example a turn.
            check(int(dataset["numExamples"]) == 2 * len(CONVERSATIONS),
                  f"examples: {dataset}")
            job = cli(bin_dir, server, "jobs", "create", "--dataset",
                      dataset["name"], "--max-steps", "3", "--seq-len", "160",
                      "--rank", "2", "--batch-size", "2")
            deadline = time.time() + 120
            while True:
                job = cli(bin_dir, server, "jobs", "get", job["name"])
                status = job.get("status", "")
                if status.endswith(("SUCCEEDED", "FAILED", "CANCELLED")):
                    break
                if time.time() > deadline:
                    sys.exit(f"FAIL: the job did not finish: {job}")
                time.sleep(0.2)
            check(status.endswith("SUCCEEDED"),
                  f"job: {json.dumps(job)}\n{server.log()}")

            messages = work / "prompt.json"
            messages.write_text(json.dumps(PROMPT))

            def sample(*extra: str) -> list[int]:
                answer = cli(bin_dir, server, "sample", "--messages",
                             str(messages), "--job", job["name"],
                             "--max-tokens", "2", "--temperature", "0",
                             *extra)
                return [int(t) for t in answer["promptTokens"]]

            thinking = sample()
            no_thinking = sample("--chat-template-kwargs",
                                 '{"enable_thinking": false}')
            expected_thinking = hf_prompt_ids(tok)
            expected_no_thinking = hf_prompt_ids(tok, enable_thinking=False)
            check(expected_no_thinking != expected_thinking,
                  "transformers renders enable_thinking=false alike")
            check(thinking == expected_thinking,
                  f"default prompt: {thinking} != {expected_thinking}")
            check(no_thinking == expected_no_thinking,
                  f"enable_thinking=false prompt: {no_thinking} != "
                  f"{expected_no_thinking}")
        finally:
            server.stop()
    print("qwen3 server end to end:",
          "FAILED" if failures else "ok", f"({len(failures)} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
