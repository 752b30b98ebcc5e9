#!/usr/bin/env python3
"""Two models on the same prompts, greedy: where their continuations part, and how fast each is.

Usage: python3 examples/python/compare_models.py MODEL_A MODEL_B [PROMPT...]
"""

import sys

import qhx


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    prompts = sys.argv[3:] or ["And it came to pass", "In the beginning God created"]
    models = [qhx.Model(path) for path in sys.argv[1:3]]
    for prompt in prompts:
        results = []
        for m in models:
            stream = m.generate(prompt, max_tokens=32, temperature=0, stream=True)
            stream.text()
            results.append(stream.result)
        a, b = (r.tokens for r in results)
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        print(f"{prompt!r}: the same first {same} tokens")
        for m, r in zip(models, results):
            tok_s = 1000 * max(r.n_generated - 1, 1) / max(r.decode_ms, 1e-9)
            print(f"  {m.info.name}: {r.text!r} ({tok_s:.0f} tok/s, TTFT {r.ttft_ms:.0f} ms)")


if __name__ == "__main__":
    main()
