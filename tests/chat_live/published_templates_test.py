#!/usr/bin/env python3
"""Published chat templates, live against transformers.

The chat templates llama.cpp collects from published models (about 70:
Qwen2.5/3/3.5, QwQ, Llama 3.x, Mistral, DeepSeek V3.x/R1, gpt-oss, Gemma,
Phi, Granite, GLM, Kimi, MiniMax, Nemotron, SmolLM3, ...) are fetched at
set-up from PyPI's llama-cpp-python source distribution (deploy/setup.sh;
none is copied into the repository). Each is put, as tokenizer_config.json's
chat_template, beside the chat fixture's tokenizer, and every fixture
conversation (tests/fixtures/golden/chat_templates/conversations.jsonl:
system or not, multi-turn, unicode, empty content, tool calls and answers,
reasoning content, template variables) goes through `loraplex-tokenize
--input` and through transformers' apply_chat_template:

* where transformers renders the conversation, loraplex gives its ids and
  the masks of the prefix rule, or of the per-turn rule where the template
  is not prefix-stable (both implemented independently in
  tools/golden/make_chat_template_golden.py), or refuses the line naming a
  Jinja construct it does not support yet;
* where transformers refuses it, so does loraplex.

Any other outcome is a failure: no silent mismatch. The summary lists, per
template, what matched and what was refused.

All of it runs twice: with the chat fixture's small tokenizer, and with a
real one, Qwen2's 151k-token vocabulary, which transformers converts from
the vocabulary-only GGUF file (llama.cpp's models/ggml-vocab-qwen2.gguf)
fetched from the same source distribution; with the real one, the
tokenizer golden corpus (tests/fixtures/golden/tokenizers/corpus.jsonl)
must also give transformers' ids. A missing GGUF file is a failure that
says so.

    published_templates_test.py BIN_DIR TEMPLATES_DIR
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "golden"))

from make_chat_template_golden import (  # noqa: E402
    Renderer,
    overlap_mask,
    prefix_spans,
    spans_to_mask,
    turn_examples,
)
from transformers import AutoTokenizer  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "golden" / "chat_templates"
CORPUS = REPO / "tests" / "fixtures" / "golden" / "tokenizers" / "corpus.jsonl"
# A real tokenizer: the vocabulary-only GGUF file of Qwen2's (151,936 tokens)
# that deploy/setup.sh fetches beside the templates.
REAL_VOCAB = "ggml-vocab-qwen2.gguf"
# At least this many published templates must match on every conversation
# transformers renders (none refused): a floor against regressions.
MIN_FULLY_EQUAL = 70


def dataset_line(conversation: dict) -> dict:
    line = {"messages": conversation["messages"]}
    if "tools" in conversation:
        line["tools"] = conversation["tools"]
    if "kwargs" in conversation:
        line["chat_template_kwargs"] = conversation["kwargs"]
    return line


def expected_examples(render: Renderer, messages) -> list[dict] | None:
    """What training must see, by the rules; None where it must refuse."""
    if "generation" in render.template and "endgeneration" in render.template:
        # {% generation %} blocks decide: HF's assistant spans, those of
        # weight-0 messages left out.
        text, spans = render.generation_spans(messages, False)
        weights = [m.get("weight", 1) for m in messages
                   if m["role"] == "assistant"]
        if len(weights) != len(spans):
            return None
        kept = [s for s, w in zip(spans, weights) if w != 0]
        mask = spans_to_mask(render.tok, text, kept)
        if not any(mask[1:]):
            return None
        return [{"ids": render.ids(messages, False), "mask": [0] + mask[1:]}]
    try:
        spans = prefix_spans(render, messages)
        full = render.text(messages, False)
        mask = overlap_mask(render.tok, full, spans)
        if any(mask[1:]):
            return [{"ids": render.ids(messages, False), "mask": [0] + mask[1:]}]
    except ValueError:
        pass
    try:
        turns = turn_examples(render, messages)
    except ValueError:
        return None
    return [{"ids": t["ids"], "mask": t["mask"]} for t in turns] or None


def loraplex_rows(bin_dir: Path, model_dir: Path, lines: list[dict]) -> list:
    """Per input line: the examples loraplex-tokenize shows, or its error."""
    data = model_dir / "data.jsonl"
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    run = subprocess.run(
        [str(bin_dir / "loraplex-tokenize"), "--model", str(model_dir),
         "--input", str(data)],
        capture_output=True, text=True, timeout=600)
    per_line: list = [[] for _ in lines]
    single = 0  # Rows without "line" belong to the next line in order.
    for row in map(json.loads, run.stdout.splitlines()):
        if "line" in row:
            number = row["line"] - 1
            if "error" in row:
                per_line[number] = row["error"]
            else:
                per_line[number].append(row)
            single = number + 1
        else:
            while per_line[single] != []:
                single += 1
            per_line[single].append(row)
            single += 1
    return per_line


def check_template(bin_dir: Path, path: Path, tok, tokenizer_dir: Path,
                   conversations) -> dict:
    template = path.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        (model_dir / "tokenizer.json").write_bytes(
            (tokenizer_dir / "tokenizer.json").read_bytes())
        config = json.loads(
            (tokenizer_dir / "tokenizer_config.json").read_text())
        config["chat_template"] = template
        (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
        rows = loraplex_rows(bin_dir, model_dir,
                             [dataset_line(c) for c in conversations])
    result = {"equal": 0, "refused": [], "both_refuse": 0, "mismatch": []}
    for conversation, got in zip(conversations, rows):
        render = Renderer(tok, template, conversation.get("tools"),
                          conversation.get("kwargs", {}))
        name = conversation["name"]
        try:
            render.text(conversation["messages"], False)
            want = expected_examples(render, conversation["messages"])
        except Exception:  # noqa: BLE001 - transformers refuses it
            want = None
        if isinstance(got, str):
            if want is None:
                result["both_refuse"] += 1
            elif "not supported" in got or "not a function the chat" in got:
                result["refused"].append(f"{name}: {got}")
            else:
                result["mismatch"].append(f"{name}: loraplex refused: {got}")
            continue
        if want is None:
            result["mismatch"].append(
                f"{name}: transformers refuses or trains nothing, loraplex "
                f"gave {len(got)} example(s)")
            continue
        if [(w["ids"], w["mask"]) for w in want] != [
                (g["ids"], g["mask"]) for g in got]:
            result["mismatch"].append(
                f"{name}: {len(got)} example(s) differ from transformers' "
                f"{len(want)}")
            continue
        result["equal"] += 1
    return result


def real_vocabulary(templates_dir: Path, out: Path) -> Path | None:
    """A tokenizer directory converted by transformers from the fetched
    vocabulary-only GGUF file; None when the file is missing."""
    gguf = templates_dir / REAL_VOCAB
    if not gguf.exists():
        return None
    tok = AutoTokenizer.from_pretrained(str(templates_dir), gguf_file=REAL_VOCAB)
    tok.save_pretrained(str(out))
    # The conversion leaves tokenizer.json without Qwen2's NFC normalizer,
    # which Qwen2Tokenizer adds when the directory is loaded: saved again,
    # tokenizer.json is what transformers runs (and what Qwen2's has).
    AutoTokenizer.from_pretrained(str(out)).save_pretrained(str(out))
    normalizer = json.loads((out / "tokenizer.json").read_text())["normalizer"]
    if normalizer != {"type": "NFC"}:
        raise SystemExit(f"{REAL_VOCAB}: converted without NFC: {normalizer}")
    return out


def check_corpus(bin_dir: Path, tokenizer_dir: Path, tok) -> int:
    """The tokenizer golden corpus as text lines: loraplex's ids must be
    transformers' (text lines add BOS and EOS as the tokenizer defines
    them). Returns the number of mismatched strings."""
    texts = [json.loads(line)["text"] for line in
             CORPUS.read_text(encoding="utf-8").split("\n") if line]
    texts = [t for t in texts if t]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (model_dir / name).write_bytes((tokenizer_dir / name).read_bytes())
        rows = loraplex_rows(bin_dir, model_dir, [{"text": t} for t in texts])
    bos = [tok.bos_token_id] if tok.bos_token_id is not None and getattr(
        tok, "add_bos_token", False) else []
    mismatches = 0
    for text, got in zip(texts, rows):
        want = bos + tok.encode(text, add_special_tokens=False) + [
            tok.eos_token_id]
        if isinstance(got, str) or len(got) != 1 or got[0]["ids"] != want:
            mismatches += 1
            if mismatches <= 5:
                shown = got if isinstance(got, str) else [g["ids"] for g in got]
                print(f"MISMATCH corpus {json.dumps(text)[:80]}: loraplex "
                      f"{str(shown)[:200]}, transformers {str(want)[:200]}")
    print(f"corpus: {len(texts) - mismatches} of {len(texts)} strings give "
          "transformers' ids")
    return mismatches


def check_templates(bin_dir: Path, templates, tok, tokenizer_dir: Path,
                    conversations, label: str) -> tuple[int, int]:
    """(templates fully equal, mismatched conversations)."""
    failures = 0
    fully_equal = 0
    for path in templates:
        r = check_template(bin_dir, path, tok, tokenizer_dir, conversations)
        status = "ok" if not r["mismatch"] and not r["refused"] else (
            "REFUSED" if not r["mismatch"] else "MISMATCH")
        fully_equal += status == "ok"
        print(f"{status:8} {path.stem}: {r['equal']} equal, "
              f"{r['both_refuse']} refused by both, {len(r['refused'])} "
              f"refused (unsupported Jinja), {len(r['mismatch'])} mismatched")
        for line in r["mismatch"] + r["refused"][:1]:
            print(f"           {line[:300]}")
        failures += len(r["mismatch"])
    print(f"{label}: {fully_equal} of {len(templates)} published templates "
          f"equal transformers on every conversation it renders; {failures} "
          "mismatched conversations")
    return fully_equal, failures


def main() -> int:
    bin_dir, templates_dir = Path(sys.argv[1]), Path(sys.argv[2])
    templates = sorted(templates_dir.glob("*.jinja"))
    if len(templates) < 60:
        print(f"expected the published templates in {templates_dir} "
              f"(deploy/setup.sh fetches them), found {len(templates)}")
        return 1
    conversations = [json.loads(line) for line in
                     (FIXTURES / "conversations.jsonl").read_text().splitlines()
                     if line.strip()]
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        real_dir = real_vocabulary(templates_dir, Path(tmp) / "real")
        tokenizers = [("chat fixture tokenizer", FIXTURES / "tokenizer")]
        if real_dir is None:
            print(f"MISSING {templates_dir / REAL_VOCAB}: the real vocabulary "
                  "(Qwen2's, 151k tokens) is not there; deploy/setup.sh "
                  "fetches it. Only the fixture tokenizer was checked.")
            failed = True
        else:
            tokenizers.append((f"{REAL_VOCAB} (converted by transformers)",
                               real_dir))
        for label, tokenizer_dir in tokenizers:
            print(f"== {label}")
            tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
            if tokenizer_dir == real_dir:
                failed |= check_corpus(bin_dir, tokenizer_dir, tok) > 0
            fully_equal, failures = check_templates(
                bin_dir, templates, tok, tokenizer_dir, conversations, label)
            if fully_equal < MIN_FULLY_EQUAL:
                print(f"fewer than {MIN_FULLY_EQUAL} templates fully equal")
                failed = True
            failed |= failures > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
