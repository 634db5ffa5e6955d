#!/usr/bin/env python3
"""Generate golden tokenizer.json fixtures for loraplex's C++ tokenizer.

What it produces
----------------
Under ``tests/fixtures/golden/tokenizers/`` (or ``--out``):

* ``corpus.jsonl``: one ``{"text": ...}`` per line, the strings every
  configuration is checked on (see ``build_corpus``: every Unicode general
  category, CJK, emoji with ZWJ and skin tones, combining marks, RTL, Hangul
  jamo, whitespace runs, ``\\r\\n``, tabs, digit runs, contractions, code,
  added tokens inside text, a 10,000-character word, ...);
* one folder per configuration, each a checkpoint-style tokenizer:
  ``tokenizer.json`` (written by HF ``tokenizers``), ``tokenizer_config.json``
  (bos/eos/pad names, as transformers writes them) and ``expected.jsonl``
  with, for line i of the corpus,

  - ``ids``: ``encode(text, add_special_tokens=False).ids``
  - ``decoded``: ``decode(ids, skip_special_tokens=True)``
  - ``offsets`` (first ``OFFSET_LINES`` lines only): each token's span in
    the text as UTF-8 byte offsets ``[start, end)``
  - ``with_specials`` (first ``SPECIAL_LINES`` lines only):
    ``encode(text).ids``, post-processor included.

The configurations (vocabularies trained here with ``BpeTrainer`` on a
generated corpus, so nothing is downloaded):

* ``llama3_like``  Split with a Llama-3-style regex (``\\p{N}{1,3}``), then
  ByteLevel without regex; ``ignore_merges``; TemplateProcessing adds
  ``<|begin_of_text|>``; ByteLevel decoder; special header/turn tokens.
* ``qwen2_like``   NFC normalizer; Split with a Qwen2-style regex (single
  digits); ByteLevel; ChatML special tokens plus non-special added tokens
  ``<think>``/``</think>`` and a normalized added token.
* ``gpt2``         ByteLevel pre-tokenizer with its own regex;
  ``<|endoftext|>``.
* ``llama2_like``  SentencePiece-style BPE: Prepend + Replace normalizers,
  ``byte_fallback`` to ``<0xNN>``, fused ``<unk>``; decoder Replace +
  ByteFallback + Fuse + Strip; ``<s>`` from TemplateProcessing; an lstrip
  added token.
* ``metaspace_digits``  Metaspace pre-tokenizer (prepend_scheme "first",
  split) followed by Digits(individual_digits); byte_fallback; Metaspace +
  ByteFallback + Fuse decoder; rstrip and single_word added tokens.
* ``nfkc_lowercase``  NFKC, Lowercase and Strip normalizers; WhitespaceSplit,
  Punctuation, Whitespace and Digits pre-tokenizers; byte_fallback.
* ``han_split``  Split on scripts (``\\p{Han}``, ``\\p{Hiragana}``,
  ``\\p{Garay}``, ...), then ByteLevel.

HF's Unicode tables are of several ages, none the newest (see
``tools/golden/make_hf_unicode_tables.py``); ``NEWER_UNICODE`` holds
strings where each of them differs from the standard, and loraplex must
give HF's ids there too.

Why
---
loraplex reads tokenizer.json itself (no Rust library at run time); its ids
must equal HF ``tokenizers`` token for token and its decode must equal HF's.
HF ``tokenizers`` is the reference.

How to regenerate
-----------------
From the repository root::

    python3 -m venv v && v/bin/pip install tokenizers==0.23.3 && \\
        v/bin/python tools/golden/make_tokenizer_golden.py

The output is deterministic for a given ``tokenizers`` version and the
committed tokenizer.json files, which are kept unless ``--retrain``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import unicodedata
from pathlib import Path

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "tests" / "fixtures" / "golden" / "tokenizers"
TOKENIZERS_VERSION = "0.23.3"
OFFSET_LINES = 600
SPECIAL_LINES = 60

LLAMA3_STYLE_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_STYLE_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Script properties: Oniguruma's \p{Han} is the Script property (U+3001 and
# U+3002 are Common), PCRE2's Script_Extensions.
HAN_SPLIT = (r"\p{Han}+|\p{Hiragana}+|\p{Katakana}+|[\p{Latin}\p{Garay}]+|"
             r"\p{N}+| ?[^\s\p{Han}\p{Hiragana}\p{Katakana}\p{Latin}\p{N}]+|\s+")

WORDS = (
    "the of and to in is you that it he was for on are as with his they at be "
    "this have from or one had by word but not what all were we when your can "
    "said there use an each which she do how their if will up other about out "
    "many then them these so some her would make like him into time has look "
    "two more write go see number no way could people my than first water been "
    "call who oil its now find long down day did get come made may part model "
    "token adapter training gradient optimizer learning rate loss batch "
    "hello world function return value string integer float tensor"
).split()
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "if x == None:\n\tprint('none')\r\n",
    "SELECT id, name FROM users WHERE age >= 21;",
    "#include <vector>\nstd::vector<int> v{1, 2, 3};",
    "const y = (a) => a ?? b?.c;  // comment",
    "<div class=\"x\">&amp;</div>",
    "x = {'key': [1, 2.5, -3e10], \"k2\": null}",
    "    indented\n        more\n",
    "path/to/file_name.py:123:45: error: bad",
]
CONTRACTIONS = [
    "I'm here", "you're", "they'LL go", "DON'T", "it's", "we've", "she'd",
    "O'Neil's", "'s", "'tis", "can't won't", "I'M", "We'Re", "THEY'VE",
]
SPECIAL_CASES = [
    "", " ", "  ", "\n", "\r\n", "\t", " \t \n ", "a", "A", "1", ".", "a b",
    "a  b", "a   b", "a\n\nb", "a\r\nb", "a\tb", "trailing   ", "   leading",
    "12345678901234567890", "3.14159", "1,000,000", "v2.0.1", "x1y22z333",
    "٣٤٥ ١٢", "١٢٣٤", "Ⅻ ⅻ ½ ²",
]
EMOJI = [
    "👨‍👩‍👧‍👦", "👍🏽", "👩🏾‍💻", "🇯🇵🇫🇷", "❤️", "🏳️‍🌈", "😀😃😄", "a👍b",
    "🧑‍🤝‍🧑 together", "✋🏿 stop",
]
SCRIPTS = [
    "日本語のテキストです。", "中文文本，测试一下。", "한국어 텍스트입니다",
    "مرحبا بالعالم", "שלום עולם", "Привет, мир!", "Γειά σου Κόσμε",
    "नमस्ते दुनिया", "สวัสดีชาวโลก", "한글 jamo", "e\u0301 vs \u00e9",
    "a\u0308\u0304", "A\u030a\u0301", "\u1100\u1161\u11a8", "ﬁ ﬂ ﬃ",
    "Ａ全角ｶﾀｶﾅ", "Straße", "İstanbul ıi", "ǅungla", "مرحبا 123 world",
]

# Where HF's Unicode tables differ from the newest standard (and from
# utf8proc's and PCRE2's; see tools/golden/make_hf_unicode_tables.py): marks
# newer than HF's normalizers' Unicode 9.0 (U+1DF6, U+07FD: no reordering or
# composition around them), a composition and compatibility decompositions
# they do not know (U+11935 U+11930, U+1E030, U+32FF, U+1FBF5), letters and
# digits of Unicode 15 and 16 that HF's regexes, char::is_numeric and
# char::to_lowercase know and PCRE2 and utf8proc do not (Cyrillic TJE,
# Garay, Kawi, CJK extensions H and I, Sunuwar digits; before a contraction
# a split regex parts differently), punctuation whose
# category changed (U+166D, U+111C9, U+2E43, U+061D), and Unicode 17
# letters and digits that none of them knows.
NEWER_UNICODE = [
    "a\u1df6\u0316 x", "e\u07fd\u0301", "no\u07fd\U00011102no",
    "\U00011935\U00011930 \U00011938", "\U0001E030\U0001E031 \u32ff",
    "\U0001FBF5\U0001FBF6 7", "\u1c89\u1c8a word\u1c89x",
    "\U00010D50\U00010D70 Garay \U00010D40\U00010D41 42",
    "\U00011F04\U00011F05\U00011F41 kawi", "\U00031350\U00031351 \U0002EBF0",
    "\u2ffc\u31e4 x", "12\U00011BF0\U00011BF1 3", "a\u166db \U000111c9 \u2e43\u061d.",
    "\U0001171E\U00011700", "\U00011DE0\U00011DE1 \U00016EA0\U00016EBB",
    "\uA7CB\uA7CC\uA7DC \uA7CE", "The \u1c89X \u1DFA\u0301 \U00010D4E.",
    "\u1c89's \U00010D50'll \U00010D40's \U00011F04've \U00031350'd",
    "\u6f22\u5b57\u3001\u304b\u306a\u3002\u30ab\u30ca\u30fc \U00031350\u4e00 a\U00010D50b",
]


def added_token_cases(config_tokens: list[str]) -> list[str]:
  """Strings with the configuration's added tokens inside text."""
  out = []
  for token in config_tokens:
    out += [token, f"Hello{token}world", f"a {token} b", f"  {token}  ",
            f"{token}{token}", f"x{token}\n{token}y", f"{token[:-1]}"]
  return out


def category_strings(rng: random.Random) -> list[str]:
  """Strings built around characters of every general category."""
  by_category: dict[str, list[int]] = {}
  for cp in range(0x110000):
    if 0xD800 <= cp <= 0xDFFF:
      continue
    category = unicodedata.category(chr(cp))
    if category == "Cn":
      continue  # unassigned ones come from a fixed range below
    by_category.setdefault(category, []).append(cp)
  # Never assigned in any Unicode version so far (planes 4 to 13).
  by_category["Cn"] = list(range(0x40000, 0x40100))
  out = []
  for category in sorted(by_category):
    points = by_category[category]
    for i in range(42):
      chars = [chr(rng.choice(points)) for _ in range(rng.randint(1, 4))]
      word = rng.choice(WORDS)
      layout = i % 6
      if layout == 0:
        out.append("".join(chars))
      elif layout == 1:
        out.append(word + "".join(chars) + word)
      elif layout == 2:
        out.append(word + " " + " ".join(chars) + " " + word)
      elif layout == 3:
        out.append("".join(chars) + " " + word + "'s " + str(rng.randint(0, 9999)))
      elif layout == 4:
        out.append(" " + "".join(chars) + "\n" + "".join(chars) + " ")
      else:
        out.append(word.capitalize() + ", " + "".join(chars) + "!")
  return out


def random_sentences(rng: random.Random, count: int) -> list[str]:
  pieces = WORDS + [".", ",", "!", "?", ":", ";", "-", "(", ")", "\"", "'",
                    "  ", "\n", "\t", "\r\n", "123", "4567", "89", "0.5"]
  out = []
  for _ in range(count):
    tokens = [rng.choice(pieces) for _ in range(rng.randint(1, 24))]
    text = ""
    for token in tokens:
      if rng.random() < 0.15:
        token = token.upper() if rng.random() < 0.5 else token.capitalize()
      text += token if rng.random() < 0.2 else " " + token
    if rng.random() < 0.2:
      text += rng.choice(EMOJI + SCRIPTS)
    out.append(text)
  return out


def build_corpus(all_added: list[str]) -> list[str]:
  rng = random.Random(20261201)
  corpus = SPECIAL_CASES + CONTRACTIONS + CODE + EMOJI + SCRIPTS
  corpus += NEWER_UNICODE
  corpus += added_token_cases(all_added)
  corpus += category_strings(rng)
  corpus += random_sentences(rng, 700)
  long_word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                      for _ in range(10000))
  corpus += [long_word, "a" * 10000, "ab" * 2500 + " " + "7" * 3000,
             " " * 300 + "x", "\n" * 50]
  return corpus


def training_corpus() -> list[str]:
  rng = random.Random(7)
  lines = random_sentences(rng, 4000) + CODE * 20 + SCRIPTS * 10
  lines += CONTRACTIONS * 10 + EMOJI * 5
  return lines


def train(tokenizer: Tokenizer, vocab_size: int, special: list[str],
          byte_level: bool, limit_alphabet: int | None = None) -> None:
  kwargs = dict(vocab_size=vocab_size, special_tokens=special,
                show_progress=False)
  if byte_level:
    kwargs["initial_alphabet"] = pre_tokenizers.ByteLevel.alphabet()
  if limit_alphabet is not None:
    kwargs["limit_alphabet"] = limit_alphabet
  tokenizer.train_from_iterator(training_corpus(), trainers.BpeTrainer(**kwargs))


def trained_model(tokenizer: Tokenizer) -> tuple[dict, list]:
  model = json.loads(tokenizer.to_str())["model"]
  merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
            for m in model["merges"]]
  return model["vocab"], merges


def with_byte_fallback(tokenizer: Tokenizer, leading: list[str], **bpe_kwargs
                       ) -> models.BPE:
  """The trained vocabulary behind `leading` tokens and <0x00>..<0xFF>."""
  vocab, merges = trained_model(tokenizer)
  new_vocab = {token: i for i, token in enumerate(leading)}
  for byte in range(256):
    new_vocab[f"<0x{byte:02X}>"] = len(new_vocab)
  for token, _ in sorted(vocab.items(), key=lambda item: item[1]):
    if token not in new_vocab:
      new_vocab[token] = len(new_vocab)
  return models.BPE(new_vocab, merges, byte_fallback=True, **bpe_kwargs)


def template(bos: str, tokenizer: Tokenizer) -> processors.TemplateProcessing:
  return processors.TemplateProcessing(
      single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
      special_tokens=[(bos, tokenizer.token_to_id(bos))])


def llama3_like() -> tuple[Tokenizer, dict]:
  special = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
             "<|end_header_id|>", "<|eot_id|>"]
  special += [f"<|reserved_special_token_{i}|>" for i in range(6)]
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(LLAMA3_STYLE_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  train(tok, 1500, [], byte_level=True)
  vocab, merges = trained_model(tok)
  tok.model = models.BPE(vocab, merges, ignore_merges=True)
  tok.add_special_tokens(special)
  tok.post_processor = processors.Sequence([
      processors.ByteLevel(trim_offsets=False),
      template("<|begin_of_text|>", tok)])
  return tok, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def qwen2_like() -> tuple[Tokenizer, dict]:
  tok = Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN2_STYLE_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  train(tok, 1400, [], byte_level=True)
  tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
  tok.add_tokens([tokenizers.AddedToken("<think>", normalized=False),
                  tokenizers.AddedToken("</think>", normalized=False),
                  tokenizers.AddedToken("Straße", normalized=True)])
  return tok, {"bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>"}


def gpt2() -> tuple[Tokenizer, dict]:
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=True)
  train(tok, 1200, ["<|endoftext|>"], byte_level=True)
  return tok, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}


def llama2_like() -> tuple[Tokenizer, dict]:
  tok = Tokenizer(models.BPE())
  tok.normalizer = normalizers.Sequence([
      normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
  train(tok, 900, [], byte_level=False, limit_alphabet=120)
  leading = ["<unk>", "<s>", "</s>"]
  tok.model = with_byte_fallback(tok, leading, unk_token="<unk>",
                                 fuse_unk=True)
  tok.add_special_tokens(leading)
  tok.add_special_tokens([tokenizers.AddedToken("<mask>", lstrip=True,
                                                normalized=False)])
  tok.decoder = decoders.Sequence([
      decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
      decoders.Strip(" ", 1, 0)])
  tok.post_processor = template("<s>", tok)
  return tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def metaspace_digits() -> tuple[Tokenizer, dict]:
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Metaspace("▁", prepend_scheme="first", split=True),
      pre_tokenizers.Digits(individual_digits=True)])
  train(tok, 900, [], byte_level=False, limit_alphabet=150)
  leading = ["<unk>", "<s>", "</s>"]
  tok.model = with_byte_fallback(tok, leading, unk_token="<unk>")
  tok.add_special_tokens(leading)
  tok.add_tokens([tokenizers.AddedToken("[NL]", rstrip=True, normalized=False),
                  tokenizers.AddedToken("word", single_word=True,
                                        normalized=False)])
  tok.decoder = decoders.Sequence([
      decoders.Metaspace("▁", prepend_scheme="first", split=True),
      decoders.ByteFallback(), decoders.Fuse()])
  tok.post_processor = template("<s>", tok)
  return tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def nfkc_lowercase() -> tuple[Tokenizer, dict]:
  tok = Tokenizer(models.BPE())
  tok.normalizer = normalizers.Sequence([
      normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip()])
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
      pre_tokenizers.Whitespace(), pre_tokenizers.Digits(True)])
  train(tok, 900, [], byte_level=False, limit_alphabet=150)
  leading = ["<unk>", "<s>", "</s>"]
  tok.model = with_byte_fallback(tok, leading, unk_token="<unk>")
  tok.add_special_tokens(leading)
  tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
  tok.post_processor = template("<s>", tok)
  return tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def han_split() -> tuple[Tokenizer, dict]:
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(HAN_SPLIT), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  train(tok, 1200, ["<|endoftext|>"], byte_level=True)
  return tok, {"bos_token": None, "eos_token": "<|endoftext|>"}


CONFIGS = {
    "llama3_like": llama3_like,
    "qwen2_like": qwen2_like,
    "gpt2": gpt2,
    "llama2_like": llama2_like,
    "metaspace_digits": metaspace_digits,
    "nfkc_lowercase": nfkc_lowercase,
    "han_split": han_split,
}


def byte_offsets(text: str, char_offsets: list[tuple[int, int]]) -> list:
  starts = [0]
  for ch in text:
    starts.append(starts[-1] + len(ch.encode("utf-8")))
  return [[starts[s], starts[e]] for s, e in char_offsets]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
  parser.add_argument(
      "--retrain", action="store_true",
      help="train every vocabulary anew (by default a configuration whose "
      "tokenizer.json is already in --out keeps it: BpeTrainer breaks ties "
      "differently from run to run with limit_alphabet)")
  args = parser.parse_args()
  if tokenizers.__version__ != TOKENIZERS_VERSION:
    print(f"warning: tokenizers {tokenizers.__version__}, fixtures were made "
          f"with {TOKENIZERS_VERSION}", file=sys.stderr)
  built = {name: make() for name, make in CONFIGS.items()}
  all_added = sorted({token.content for tok, _ in built.values()
                      for token in tok.get_added_tokens_decoder().values()})
  corpus = build_corpus(all_added)
  kept = {}
  if not args.retrain:
    for name in built:
      path = args.out / name / "tokenizer.json"
      if path.exists():
        kept[name] = path.read_text(encoding="utf-8")
  if args.out.exists():
    shutil.rmtree(args.out)
  args.out.mkdir(parents=True)
  with open(args.out / "corpus.jsonl", "w", encoding="utf-8") as f:
    for text in corpus:
      f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
  for name, (tok, config) in built.items():
    folder = args.out / name
    folder.mkdir()
    if name in kept:
      (folder / "tokenizer.json").write_text(kept[name], encoding="utf-8")
    else:
      tok.save(str(folder / "tokenizer.json"))
    config = {key: value for key, value in config.items()}
    config.setdefault("pad_token", None)
    config["model_max_length"] = 4096
    with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as f:
      json.dump(config, f, indent=2, ensure_ascii=False)
      f.write("\n")
    # Re-load from the file so what is checked is what is committed.
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    with open(folder / "expected.jsonl", "w", encoding="utf-8") as f:
      for i, text in enumerate(corpus):
        encoding = tok.encode(text, add_special_tokens=False)
        line = {"ids": encoding.ids,
                "decoded": tok.decode(encoding.ids, skip_special_tokens=True)}
        if i < OFFSET_LINES:
          line["offsets"] = byte_offsets(text, encoding.offsets)
        if i < SPECIAL_LINES:
          line["with_specials"] = tok.encode(text).ids
        f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"{name}: vocab {tok.get_vocab_size()}, {len(corpus)} strings")
  return 0


if __name__ == "__main__":
  sys.exit(main())
