"""Pins the Unicode version of Hugging Face tokenizers' NFC normalizer (the tables of its
unicode-normalization-alignments crate are Unicode 9.0.0; ICU's and Python's are newer) by
recording what `tokenizers.normalizers.NFC` makes of every string whose NFC depends on the table
version: each code point with a canonical combining class above 1, placed before U+0334 (class
1), which a table that knows the class reorders; each code point with a canonical decomposition,
alone and followed by U+0334; and the compositions added after Unicode 9.0.

Writes tests/fixtures/tokenizer/nfc/cases.jsonl: {"text", "nfc"} per line (ASCII-escaped JSON).

Usage: $ORACLE_VENV/bin/python tools/oracle/make_nfc_fixtures.py
"""

import json
import pathlib
import unicodedata

import tokenizers
from tokenizers import normalizers

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "tokenizer" / "nfc" / "cases.jsonl"


def code_points():
    for cp in range(0x110000):
        if not 0xD800 <= cp < 0xE000:
            yield cp


def main() -> None:
    nfc = normalizers.NFC()
    texts = []
    for cp in code_points():
        c = chr(cp)
        if unicodedata.combining(c) > 1:
            texts.append("x" + c + "\u0334")
        decomposition = unicodedata.decomposition(c)
        if decomposition and not decomposition.startswith("<"):
            texts.append(c)
            texts.append(c + "\u0334")
            texts.append(unicodedata.normalize("NFD", c))
    # A composition of Unicode 13.0 (Dives Akuru) that Unicode 9.0 leaves as it is, and two old
    # ones that every version composes.
    texts += ["\U00011935\U00011930", "a\U00011935\U00011930b", "\u0B47\u0B3E", "\u1B05\u1B35"]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="ascii") as f:
        for text in texts:
            f.write(json.dumps({"text": text, "nfc": nfc.normalize_str(text)}) + "\n")
    changed = sum(1 for t in texts if nfc.normalize_str(t) != unicodedata.normalize("NFC", t))
    print(f"{OUT}: {len(texts)} strings, tokenizers {tokenizers.__version__}, "
          f"{changed} differ from Python's NFC (Unicode {unicodedata.unidata_version})")


if __name__ == "__main__":
    main()
