#!/usr/bin/env python3
"""Fetch the chat templates of published models for tests/chat_live.

llama.cpp keeps the chat templates of about 70 published models (copied from
their Hugging Face repositories) in models/templates/, and PyPI's
llama-cpp-python source distribution carries that folder. This downloads the
pinned sdist from PyPI and
extracts only the *.jinja files, and the vocabulary-only GGUF file of
Qwen2's tokenizer (ggml-vocab-qwen2.gguf), into OUT_DIR (pip fetches it from the index
it is configured with, and checks it against the index's hash; SOURCE in
OUT_DIR records the archive's sha256). Nothing it fetches is
committed; deploy/setup.sh runs it into the project's environment.

    fetch_published_templates.py OUT_DIR [--version 0.3.36]
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "llama-cpp-python"
DEFAULT_VERSION = "0.3.36"
TEMPLATES = "/vendor/llama.cpp/models/templates/"
# Vocabulary-only GGUF files of real tokenizers (transformers converts them
# with gguf_file=): Qwen2's 151k-token byte-level BPE.
VOCABS = ("/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf",)


def download_sdist(version: str, folder: Path) -> Path:
    """The sdist through pip, from the index pip is configured with (pip
    checks the file against the index's hash)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
         "--no-binary", ":all:", "--dest", str(folder),
         f"{PACKAGE}=={version}"],
        check=True)
    archives = sorted(folder.glob("*.tar.gz"))
    if len(archives) != 1:
        raise SystemExit(f"pip download left {archives} in {folder}")
    return archives[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--version", default=DEFAULT_VERSION)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        archive = download_sdist(args.version, Path(tmp))
        sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
        staging = Path(tmp) / "templates"
        staging.mkdir()
        count = 0
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = member.name
                if any(name.endswith(vocab) for vocab in VOCABS):
                    source = tar.extractfile(member)
                    (staging / Path(name).name).write_bytes(source.read())
                    continue
                if TEMPLATES in name and name.endswith(".jinja") and member.isfile():
                    source = tar.extractfile(member)
                    (staging / Path(name).name).write_bytes(source.read())
                    count += 1
        if count == 0:
            raise SystemExit(f"{archive.name}: no {TEMPLATES}*.jinja inside")
        if args.out.exists():
            shutil.rmtree(args.out)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(args.out))
        (args.out / "SOURCE").write_text(f"{PACKAGE} {args.version} sdist, sha256 {sha256}\n")
    print(f"{count} chat templates from {PACKAGE} {args.version} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
