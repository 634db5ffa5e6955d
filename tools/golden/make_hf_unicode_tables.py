#!/usr/bin/env python3
"""Generate core/tokenizer/hf_unicode_tables.h: where HF tokenizers' Unicode
data differs from the libraries loraplex's tokenizer runs on.

HF ``tokenizers`` carries Unicode tables of several ages, one per crate:

* its normalizers (NFC, NFD, NFKC, NFKD; crate unicode-normalization-
  alignments) know Unicode 9.0: a code point given a combining class or a
  decomposition later is, to them, unassigned (class 0, maps to itself,
  composes with nothing);
* its Split regexes (Oniguruma) know the general categories of a newer
  version (16.0 for tokenizers 0.23.3) than Debian's PCRE2 10.42 (14.0);
* ``char::is_numeric``, ``char::is_whitespace`` and ``char::to_lowercase``
  (Rust's std: Digits, WhitespaceSplit, Strip, Lowercase) are newer than
  utf8proc 2.8 (15.0);
* its Punctuation pre-tokenizer (crate unicode_categories) is older.

loraplex runs utf8proc and PCRE2 and applies the differences listed here.
Every entry is measured, not assumed: each code point goes through HF's own
normalizers and pre-tokenizers (this script) and through the utf8proc and
PCRE2 libraries loraplex links (through ctypes), and every code point where
they disagree is listed:

* ``kNormalizationUnassigned``: code points with a combining class or a
  decomposition in utf8proc that HF's normalizers do not reorder or
  decompose (checked: HF leaves each of them unchanged in every form, and
  agrees with utf8proc on every single code point outside the list);
* ``kPropertyAdded``: per general category and script, code points HF's
  regexes match with ``\\p{Xx}`` (``\\p{Han}``) that PCRE2's ``\\p{Xx}``
  (``\\p{sc:Han}``: PCRE2's ``\\p{Han}`` is Script_Extensions, Oniguruma's
  Script) does not; ``kPropertyExact``: HF's whole set where PCRE2 matches
  a code point HF's does not (a code point that changed category or script);
* numeric, punctuation and whitespace code points added to or removed from
  utf8proc's classes, word characters (single_word added tokens: the Rust
  regex crate's \\w) added to or removed from PCRE2's, and the lowercase
  mappings that differ.

How to regenerate (when tokenizers, utf8proc or PCRE2 changes version;
tests/core/hf_unicode_tables_test.cc fails on another utf8proc or PCRE2)::

    .venv/bin/python tools/golden/make_hf_unicode_tables.py

It takes about a minute; the output is deterministic.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import tokenizers
from tokenizers import Regex, models, normalizers, pre_tokenizers

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "core" / "tokenizer" / "hf_unicode_tables.h"
CATEGORIES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl",
              "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc",
              "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co"]
# utf8proc_category_t order (0 is Cn).
UTF8PROC_CATEGORIES = [None, "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me",
                       "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf",
                       "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc",
                       "Cf", "Cs", "Co"]
# Scripts a regex may name (\\p{Han}): Oniguruma's \\p{Han} is the Script
# property, PCRE2's the Script_Extensions one (\\p{sc:Han} is its Script).
SCRIPTS = """Adlam Ahom Arabic Armenian Balinese Bamum Batak Bengali Bhaiksuki
Bopomofo Brahmi Braille Buginese Buhid Canadian_Aboriginal Chakma Cham
Cherokee Common Coptic Cyrillic Devanagari Dogra Ethiopic Garay Georgian
Glagolitic Grantha Greek Gujarati Gunjala_Gondi Gurmukhi Gurung_Khema Han
Hangul Hanifi_Rohingya Hanunoo Hebrew Hiragana Inherited Javanese Kaithi
Kannada Katakana Kawi Kayah_Li Khmer Khojki Kirat_Rai Lao Latin Lepcha Limbu
Lisu Malayalam Masaram_Gondi Medefaidrin Meetei_Mayek Mende_Kikakui Miao
Modi Mongolian Myanmar Nag_Mundari Nandinagari New_Tai_Lue Newa Nko Nushu
Ogham Ol_Chiki Ol_Onal Oriya Osage Runic Saurashtra Sharada Sinhala
Sundanese Sunuwar Syloti_Nagri Syriac Tagalog Tagbanwa Tai_Le Tai_Tham
Tai_Viet Takri Tamil Tangut Telugu Thaana Thai Tibetan Tifinagh Tirhuta
Todhri Tulu_Tigalari Vai Wancho Yi""".split()
CODE_POINTS = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
ASCII_PUNCTUATION = set(map(ord, "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"))


class Utf8proc:
  """The utf8proc library loraplex links, through ctypes."""

  class Property(ctypes.Structure):
    _fields_ = [("category", ctypes.c_int16),
                ("combining_class", ctypes.c_int16)]

  def __init__(self):
    self.lib = ctypes.CDLL("libutf8proc.so.2")
    self.lib.utf8proc_version.restype = ctypes.c_char_p
    self.lib.utf8proc_category.restype = ctypes.c_int
    self.lib.utf8proc_tolower.restype = ctypes.c_int32
    self.lib.utf8proc_get_property.restype = ctypes.POINTER(self.Property)
    for name in ("utf8proc_NFD", "utf8proc_NFKD", "utf8proc_NFC",
                 "utf8proc_NFKC"):
      getattr(self.lib, name).restype = ctypes.c_void_p
    self.lib.free = ctypes.CDLL(None).free
    self.lib.free.argtypes = [ctypes.c_void_p]
    self.version = self.lib.utf8proc_version().decode()

  def category(self, cp: int) -> str:
    return UTF8PROC_CATEGORIES[self.lib.utf8proc_category(cp)] or "Cn"

  def combining_class(self, cp: int) -> int:
    return self.lib.utf8proc_get_property(cp).contents.combining_class

  def normalize(self, form: str, text: str) -> str:
    pointer = getattr(self.lib, "utf8proc_" + form)(text.encode())
    out = ctypes.string_at(pointer).decode()
    self.lib.free(pointer)
    return out

  def lower(self, cp: int) -> str:
    return chr(self.lib.utf8proc_tolower(cp))


class Pcre2:
  """The PCRE2 library loraplex links: which code points \\p{Xx} matches."""

  UTF, UCP = 0x00080000, 0x00020000

  def __init__(self):
    self.lib = ctypes.CDLL("libpcre2-8.so.0")
    self.lib.pcre2_compile_8.restype = ctypes.c_void_p
    self.lib.pcre2_compile_8.argtypes = [
        ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32,
        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_void_p]
    self.lib.pcre2_match_data_create_from_pattern_8.restype = ctypes.c_void_p
    self.lib.pcre2_match_data_create_from_pattern_8.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p]
    self.lib.pcre2_match_8.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
        ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p]
    self.lib.pcre2_get_ovector_pointer_8.restype = ctypes.POINTER(
        ctypes.c_size_t)
    self.lib.pcre2_get_ovector_pointer_8.argtypes = [ctypes.c_void_p]
    buffer = ctypes.create_string_buffer(32)
    self.lib.pcre2_config_8(10, buffer)  # PCRE2_CONFIG_UNICODE_VERSION
    self.unicode_version = buffer.value.decode()
    self.lib.pcre2_config_8(11, buffer)  # PCRE2_CONFIG_VERSION
    self.version = buffer.value.decode().split()[0]
    self.text = "".join(map(chr, CODE_POINTS)).encode()
    self.starts = {}
    offset = 0
    for cp in CODE_POINTS:
      self.starts[offset] = cp
      offset += len(chr(cp).encode())

  def matches(self, pattern: str) -> set[int] | None:
    error, where = ctypes.c_int(), ctypes.c_size_t()
    source = f"(?:{pattern})+".encode()
    code = self.lib.pcre2_compile_8(source, len(source), self.UTF | self.UCP,
                                    ctypes.byref(error), ctypes.byref(where),
                                    None)
    if not code:
      return None  # a name PCRE2 does not know
    data = self.lib.pcre2_match_data_create_from_pattern_8(code, None)
    found, offset = set(), 0
    while self.lib.pcre2_match_8(code, self.text, len(self.text), offset, 0,
                                 data, None) > 0:
      vector = self.lib.pcre2_get_ovector_pointer_8(data)
      start, end = vector[0], vector[1]
      for position in range(start, end):
        if position in self.starts:
          found.add(self.starts[position])
      offset = end
    return found


def hf_regex_matches(pattern: str) -> set[int]:
  """Code points HF's Split regex (Oniguruma) matches."""
  split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
  kept = set()
  for piece, _ in split.pre_tokenize_str("".join(map(chr, CODE_POINTS))):
    kept.update(map(ord, piece))
  return set(CODE_POINTS) - kept


def hf_isolated(pre_tokenizer) -> set[int]:
  """Code points a pre-tokenizer isolates (each followed by U+0000 here)."""
  text = "".join(chr(cp) + "\0" for cp in CODE_POINTS)
  return {ord(piece) for piece, _ in pre_tokenizer.pre_tokenize_str(text)
          if len(piece) == 1 and piece != "\0"}


def hf_whitespace() -> set[int]:
  split = pre_tokenizers.WhitespaceSplit()
  kept = set()
  for piece, _ in split.pre_tokenize_str("".join(map(chr, CODE_POINTS))):
    kept.update(map(ord, piece))
  return set(CODE_POINTS) - kept


def hf_single_word_characters() -> set[int]:
  """Code points that keep a single_word added token from matching beside
  them (the Rust regex crate's \\w)."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.add_tokens([tokenizers.AddedToken("qq", single_word=True)])
  token = tok.token_to_id("qq")
  encodings = tok.encode_batch(["qq" + chr(cp) for cp in CODE_POINTS])
  return {cp for cp, e in zip(CODE_POINTS, encodings) if token not in e.ids}


def normalization_unassigned(utf8proc: Utf8proc) -> list[int]:
  hf = {form: getattr(normalizers, form)() for form in
        ("NFD", "NFKD", "NFC", "NFKC")}
  listed = []
  for cp in CODE_POINTS:
    ch = chr(cp)
    decomposes = utf8proc.normalize("NFKD", ch) != ch
    combining = utf8proc.combining_class(cp)
    if decomposes and hf["NFKD"].normalize_str(ch) == ch:
      listed.append(cp)
    elif combining > 0:
      # Beside U+0334 (class 1) or U+0301 (230), which goes first tells
      # whether HF knows cp's class.
      probe = ch + "\u0334" if combining > 1 else "\u0301" + ch
      if hf["NFD"].normalize_str(probe) != utf8proc.normalize("NFD", probe):
        listed.append(cp)
  unassigned = set(listed)
  for cp in CODE_POINTS:
    ch = chr(cp)
    for form, normalizer in hf.items():
      want = ch if cp in unassigned else utf8proc.normalize(form, ch)
      if normalizer.normalize_str(ch) != want:
        raise SystemExit(f"U+{cp:04X} {form}: HF gives "
                         f"{normalizer.normalize_str(ch)!r}, expected {want!r}")
  return listed


def ranges(points) -> list[tuple[int, int]]:
  out: list[tuple[int, int]] = []
  for cp in sorted(points):
    if out and out[-1][1] + 1 == cp:
      out[-1] = (out[-1][0], cp)
    else:
      out.append((cp, cp))
  return out


def range_rows(points, indent="    ") -> str:
  cells = [f"{{0x{a:04X}, 0x{b:04X}}}," for a, b in ranges(points)]
  lines, line = [], indent
  for cell in cells:
    if len(line) + len(cell) + 1 > 80:
      lines.append(line.rstrip())
      line = indent
    line += cell + " "
  if line.strip():
    lines.append(line.rstrip())
  return "\n".join(lines) if lines else indent + "{1, 0},  // none (empty)"


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
  args = parser.parse_args()
  utf8proc, pcre2 = Utf8proc(), Pcre2()

  unassigned = normalization_unassigned(utf8proc)

  added: dict[str, set[int]] = {}
  exact: dict[str, set[int]] = {}
  properties = [(c, rf"\p{{{c}}}") for c in CATEGORIES] + [
      (script, rf"\p{{sc:{script}}}") for script in SCRIPTS]
  for name, ours_pattern in properties:
    hf = hf_regex_matches(rf"\p{{{name}}}")
    ours = pcre2.matches(ours_pattern)
    if ours is None or ours - hf:
      # PCRE2 lacks the name, or a code point moved: HF's whole set.
      exact[name] = hf
    else:
      added[name] = hf - ours

  numeric_hf = hf_isolated(pre_tokenizers.Digits(individual_digits=True))
  numeric_ours = {cp for cp in CODE_POINTS
                  if utf8proc.category(cp) in ("Nd", "Nl", "No")}
  punct_hf = hf_isolated(pre_tokenizers.Punctuation("isolated"))
  punct_ours = {cp for cp in CODE_POINTS
                if utf8proc.category(cp).startswith("P")
                or cp in ASCII_PUNCTUATION}
  space_hf = hf_whitespace()
  space_ours = {cp for cp in CODE_POINTS
                if 0x09 <= cp <= 0x0D or cp in (0x20, 0x85)
                or (cp >= 0xA0 and utf8proc.category(cp) in ("Zs", "Zl", "Zp"))}
  # added_vocabulary.cc's word pattern, as OnigurumaToPcre2 rewrites it.
  word_hf = hf_single_word_characters()
  word_ours = pcre2.matches(r"[\p{Alphabetic}\p{Join_Control}]") | (
      hf_regex_matches(r"[\p{M}\p{Nd}\p{Pc}]"))
  lowercase = normalizers.Lowercase()
  lower_rows = []
  for cp in CODE_POINTS:
    hf = lowercase.normalize_str(chr(cp))
    ours = "i\u0307" if cp == 0x130 else utf8proc.lower(cp)
    if hf != ours:
      if len(hf) != 1:
        raise SystemExit(f"U+{cp:04X} lowercases to {len(hf)} code points")
      lower_rows.append(f"    {{0x{cp:04X}, 0x{ord(hf):04X}}},")

  def category_cells(table):
    cells = [f'{{"{name}", 0x{a:04X}, 0x{b:04X}}},'
             for name in CATEGORIES + SCRIPTS
             for a, b in ranges(table.get(name, ()))]
    rows = ["    " + " ".join(cells[i:i + 2]) for i in range(0, len(cells), 2)]
    return rows, len(cells)

  category_rows, added_count = category_cells(added)
  exact_rows, _ = category_cells(exact)

  header = f"""\
// Generated by tools/golden/make_hf_unicode_tables.py; do not edit. Where HF
// tokenizers {tokenizers.__version__}'s Unicode data differs from utf8proc
// {utf8proc.version} and PCRE2 {pcre2.version} (Unicode {pcre2.unicode_version}),
// measured on every code point (see the script for how, and to regenerate
// after a version change). Used by unicode_text.cc and text_pattern.cc only.
#ifndef LORAPLEX_CORE_TOKENIZER_HF_UNICODE_TABLES_H_
#define LORAPLEX_CORE_TOKENIZER_HF_UNICODE_TABLES_H_

namespace loraplex {{
namespace hf_unicode {{

struct Range {{
  char32_t first;
  char32_t last;
}};

struct PropertyRange {{
  char name[24];  // a two-letter general category or a script
  char32_t first;
  char32_t last;
}};

struct Lowercase {{
  char32_t from;
  char32_t to;
}};

inline constexpr int kUtf8procMajor = {utf8proc.version.split(".")[0]};
inline constexpr int kUtf8procMinor = {utf8proc.version.split(".")[1]};
inline constexpr int kPcre2Major = {pcre2.version.split(".")[0]};
inline constexpr int kPcre2Minor = {pcre2.version.split(".")[1]};

// HF's normalizers (Unicode 9.0) treat these as unassigned: combining class
// 0, no decomposition, part of no composition.
inline constexpr Range kNormalizationUnassigned[] = {{
{range_rows(unassigned)}
}};

// Code points HF's regexes put in a general category or script that
// PCRE2's \\p{{Xx}} or \\p{{sc:Script}} leaves out (assigned after PCRE2's
// Unicode version).
inline constexpr PropertyRange kPropertyAdded[] = {{
{chr(10).join(category_rows) or '    {"", 1, 0},  // none'}
}};

// Categories and scripts HF and PCRE2 disagree on in both directions (a
// code point moved): HF's whole set, spelled out instead of \\p{{..}}.
inline constexpr PropertyRange kPropertyExact[] = {{
{chr(10).join(exact_rows) or '    {"", 1, 0},  // none'}
}};

// Rust's char::is_numeric (HF's Digits) against utf8proc's Nd, Nl, No.
inline constexpr Range kNumericAdded[] = {{
{range_rows(numeric_hf - numeric_ours)}
}};
inline constexpr Range kNumericRemoved[] = {{
{range_rows(numeric_ours - numeric_hf)}
}};

// HF's Punctuation pre-tokenizer against utf8proc's P* and ASCII punctuation.
inline constexpr Range kPunctuationAdded[] = {{
{range_rows(punct_hf - punct_ours)}
}};
inline constexpr Range kPunctuationRemoved[] = {{
{range_rows(punct_ours - punct_hf)}
}};

// Rust's char::is_whitespace against utf8proc's Zs, Zl, Zp and controls.
inline constexpr Range kWhitespaceAdded[] = {{
{range_rows(space_hf - space_ours)}
}};
inline constexpr Range kWhitespaceRemoved[] = {{
{range_rows(space_ours - space_hf)}
}};

// The Rust regex crate's \\w (what keeps a single_word added token from
// matching) against added_vocabulary.cc's PCRE2 pattern.
inline constexpr Range kWordAdded[] = {{
{range_rows(word_hf - word_ours)}
}};
inline constexpr Range kWordRemoved[] = {{
{range_rows(word_ours - word_hf)}
}};

// Rust's char::to_lowercase where it differs from utf8proc_tolower.
inline constexpr Lowercase kLowercase[] = {{
{chr(10).join(lower_rows) or '    {0, 0},  // none'}
}};

}}  // namespace hf_unicode
}}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_HF_UNICODE_TABLES_H_
"""
  args.out.write_text(header)
  if shutil.which("clang-format"):  # the repository's .clang-format
    subprocess.run(["clang-format", "-i", str(args.out)], check=True)
  print(f"{args.out}: {len(ranges(unassigned))} normalization ranges, "
        f"{added_count} category ranges, {len(lower_rows)} lowercase")
  return 0


if __name__ == "__main__":
  sys.exit(main())
