#!/usr/bin/env python3
"""A terminal chat on a qhx model, streamed, the conversation kept in one session.

Usage: python3 examples/python/chat.py [MODEL]   (default: models/qwen3.5-kjv; after pip install .)
"""

import sys

import qhx


def main() -> None:
    model = qhx.Model(sys.argv[1] if len(sys.argv) > 1 else "models/qwen3.5-kjv")
    print(f"{model.info.name} ({model.info.family}), prompts on {model.info.prefill_device}; "
          "an empty line ends", file=sys.stderr)
    messages = []
    with model.session() as session:
        while True:
            try:
                line = input("> ")
            except EOFError:
                break
            if not line:
                break
            messages.append({"role": "user", "content": line})
            reply = session.chat(messages, max_tokens=256, enable_thinking=False)
            try:
                for chunk in reply:
                    print(chunk.text, end="", flush=True)
            except KeyboardInterrupt:  # Ctrl-C stops the reply, not the chat
                print(" [stopped]", end="")
            print()
            messages.append({"role": "assistant", "content": reply.result.text})


if __name__ == "__main__":
    main()
