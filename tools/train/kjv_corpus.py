"""The KJV corpus of the shipped models, without torch: chapters from the `bible` program (Debian
package bible-kjv), the training / held-out split, and calibration text drawn from the training
side.

    python3 tools/train/kjv_corpus.py --calibration models/qwen3-kjv/calibration.txt

writes the calibration text for `qhx forge convert --calibrate` and llama.cpp's `llama-imatrix`:
every 50th chapter from index 0 (0, 50, 100, ...), training chapters (the held-out ones are 25,
75, ...), joined by <|endoftext|> as held_out.txt is.
"""

import argparse
import re
import subprocess
from pathlib import Path

HELD_OUT_EVERY, HELD_OUT_PHASE = 50, 25
CALIBRATION_PHASE = 0


def kjv_chapters():
    """[(heading, [verse, ...])] in canonical order, from `bible` (package bible-kjv)."""
    out = subprocess.run(["bible", "-l0", "gen1:1-rev22:21"], check=True, capture_output=True,
                         text=True).stdout
    chapters = []
    for line in out.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^  (\d+) (.*)$", line)
        if m:
            chapters[-1][1].append(m.group(2).strip())
        else:
            chapters.append((line.strip(), []))
    assert len(chapters) == 1189, len(chapters)
    assert sum(len(v) for _, v in chapters) == 31102
    return chapters


def chapter_text(heading, verses):
    return heading + "\n" + "\n".join(verses) + "\n"


def split_corpus(chapters):
    train, held = [], []
    for i, (h, v) in enumerate(chapters):
        (held if i % HELD_OUT_EVERY == HELD_OUT_PHASE else train).append(chapter_text(h, v))
    return train, held


def calibration_documents(chapters):
    return [chapter_text(h, v) for i, (h, v) in enumerate(chapters)
            if i % HELD_OUT_EVERY == CALIBRATION_PHASE]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", type=Path, required=True, help="file to write")
    args = ap.parse_args()
    docs = calibration_documents(kjv_chapters())
    args.calibration.write_text("<|endoftext|>".join(docs) + "<|endoftext|>")
    print(f"{args.calibration}: {len(docs)} chapters")


if __name__ == "__main__":
    main()
