#!/usr/bin/env python3
"""Writes the seed corpora of the libFuzzer targets (tests/fuzz/corpus/):
a few small valid inputs of each format, which the fuzzers mutate. Run from
anywhere; the outputs are committed."""

import json
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                   "fuzz", "corpus")


def write(target, name, data):
    directory = os.path.join(OUT, target)
    os.makedirs(directory, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def cbor(value):
    """CBOR (RFC 8949) of JSON-like values: what nlohmann::json reads."""
    def head(major, n):
        if n < 24:
            return bytes([major << 5 | n])
        for info, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
            if n < 1 << (8 * struct.calcsize(fmt)):
                return bytes([major << 5 | info]) + struct.pack(fmt, n)
        raise ValueError(n)
    if value is True:
        return b"\xf5"
    if value is False:
        return b"\xf4"
    if value is None:
        return b"\xf6"
    if isinstance(value, int):
        return head(0, value) if value >= 0 else head(1, -1 - value)
    if isinstance(value, float):
        return b"\xfb" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode()
        return head(3, len(raw)) + raw
    if isinstance(value, list):
        return head(4, len(value)) + b"".join(cbor(v) for v in value)
    if isinstance(value, dict):
        return head(5, len(value)) + b"".join(
            cbor(k) + cbor(v) for k, v in value.items())
    raise TypeError(type(value))


def main():
    lines = [
        {"text": "hello world"},
        {"prompt": "reverse: abc\n", "completion": "cba"},
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "yo"}]},
        {"input_ids": [1, 2, 3, 258], "loss_mask": [0, 1, 1, 1]},
    ]
    write("dataset_fuzz", "kinds.jsonl",
          "".join(json.dumps(line) + "\n" for line in lines))
    write("dataset_fuzz", "bad.jsonl",
          '{"text": 3}\n\n{"prompt": "a"}\r\n\xef\xbb\xbfnot json\n'
          '{"input_ids": [999], "loss_mask": [1, 0]}\n')

    byte_level = {
        "version": "1.0",
        "added_tokens": [{"id": 6, "content": "<s>", "single_word": False,
                          "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": True, "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False,
                           "trim_offsets": True, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False,
                    "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "vocab": {"a": 0, "b": 1, "ab": 2, "\u0120": 3, "c": 4,
                            "\u0120ab": 5},
                  "merges": ["a b", "\u0120 ab"]},
    }
    write("tokenizer_json_fuzz", "byte_level.json", json.dumps(byte_level))
    metaspace = {
        "version": "1.0",
        "added_tokens": [],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "},
             "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>",
                                                        "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [], "special_tokens": {
                               "<s>": {"id": "<s>", "ids": [1],
                                       "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"},
             "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True,
                  "fuse_unk": True,
                  "vocab": {"<unk>": 0, "<s>": 1, "<0x41>": 2, "\u2581": 3,
                            "a": 4, "\u2581a": 5},
                  "merges": [["\u2581", "a"]]},
    }
    write("tokenizer_json_fuzz", "metaspace.json", json.dumps(metaspace))

    write("peft_config_fuzz", "lora.json", json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 8,
        "lora_alpha": 16, "lora_dropout": 0.05, "use_rslora": False,
        "bias": "none", "target_modules": ["q_proj", "v_proj", "lm_head"],
        "exclude_modules": ["model.layers.3.self_attn.q_proj"],
        "base_model_name_or_path": "acme/tiny"}))
    write("peft_config_fuzz", "all.json", json.dumps({
        "peft_type": "LORA", "r": 4, "target_modules": [
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
            "down_proj"], "init_lora_weights": "gaussian"}))

    header = json.dumps({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}})
    write("safetensors_fuzz", "two.bin",
          struct.pack("<Q", 24) + header.encode())

    write("step_plan_fuzz", "active.cbor", cbor({
        "stop": False, "checkpoint": True,
        "active": [{"slot": 0, "job_id": "job-1", "step": 3,
                    "cursor": [7, 0, 2]},
                   {"slot": 2, "job_id": "job-2", "step": 0}],
        "entries": []}))
    write("step_plan_fuzz", "stop.cbor", cbor({
        "stop": True, "checkpoint": False, "active": [], "entries": []}))


if __name__ == "__main__":
    main()
