#!/usr/bin/env python3
"""Small safetensors files with every layout question a reader must answer (holes, overlaps,
zero-size tensors, trailing bytes, padding, order) and the verdict of Hugging Face's `safetensors`
library on each: tests/fixtures/safetensors/layouts/<name>.safetensors and verdicts.json
({name: {"accepted": bool, "error": "..."}}). tests/safetensors_test.cc checks that qhx accepts
exactly the files the library accepts.

Usage: $ORACLE_VENV/bin/python tools/oracle/make_safetensors_layouts.py
"""

import json
import struct
from pathlib import Path

import safetensors
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "fixtures" / "safetensors" / "layouts"


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# name -> (header, bytes of data after it)
CASES = {
    "contiguous": ({"a": entry("F32", [2], 0, 8), "b": entry("BF16", [3], 8, 14)}, 14),
    "listed_out_of_order": ({"b": entry("BF16", [3], 8, 14), "a": entry("F32", [2], 0, 8)}, 14),
    "hole_between": ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 40, 48)}, 48),
    "hole_at_start": ({"a": entry("F32", [2], 16, 24)}, 24),
    "overlap": ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, 12),
    "same_range_twice": ({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 0, 8)}, 8),
    "trailing_bytes": ({"a": entry("F32", [2], 0, 8)}, 13),
    "no_tensors_no_data": ({}, 0),
    "no_tensors_some_data": ({}, 3),
    "zero_size_first": ({"e": entry("F32", [0], 0, 0), "a": entry("F32", [2], 0, 8)}, 8),
    "zero_size_last": ({"a": entry("F32", [2], 0, 8), "e": entry("U8", [0, 4], 8, 8)}, 8),
    "zero_size_in_a_hole": ({"a": entry("F32", [2], 0, 8), "e": entry("F32", [0], 12, 12)}, 12),
    "metadata_only": ({"__metadata__": {"format": "pt"}, "a": entry("I64", [1], 0, 8)}, 8),
    "past_the_end": ({"a": entry("F32", [4], 0, 16)}, 8),
    "size_mismatch": ({"a": entry("F32", [3], 0, 8)}, 8),
}


def write(path: Path, header: dict, data_len: int, pad: str = ""):
    text = (json.dumps(header, separators=(",", ":")) + pad).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text
                     + bytes((i * 7 + 1) % 256 for i in range(data_len)))


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.safetensors"):
        old.unlink()
    verdicts = {}
    files = {name: (header, n, "") for name, (header, n) in CASES.items()}
    files["padded_header"] = ({"a": entry("F32", [2], 0, 8)}, 8, "     ")
    for name, (header, n, pad) in files.items():
        path = OUT / f"{name}.safetensors"
        write(path, header, n, pad)
        try:
            with safe_open(str(path), "pt") as f:
                for k in f.keys():
                    f.get_tensor(k)
            verdicts[name] = {"accepted": True, "error": ""}
        except Exception as e:  # the library's own message
            verdicts[name] = {"accepted": False, "error": str(e)}
    (OUT / "verdicts.json").write_text(json.dumps(
        {"safetensors": safetensors.__version__, "files": verdicts}, indent=2) + "\n")
    for name, v in verdicts.items():
        print(f"{name:24} {'accepted' if v['accepted'] else 'refused: ' + v['error']}")


if __name__ == "__main__":
    main()
