#!/usr/bin/env python3
"""Mixed traffic against `qhx serve`, and its resident memory against its memory estimate.

Starts `qhx serve` on a model, sends it completions and chats from several clients at once for a
while (prompts of 5 to 2,500 words of the model's held-out text, half of them behind one of six
shared prefixes so that the prefix cache is hit, streamed or not, some hung up early, greedy or
sampled), and samples the server's RSS. Prints the memory estimate the server admitted with, the
RSS over time, the peak and the end, and exits 1 if the peak passed the estimate.

  python3 bench/server_rss.py --model models/qwen3-kjv --seconds 240
"""
import argparse
import http.client
import json
import random
import re
import subprocess
import sys
import threading
import time


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def client(port, words, prefixes, seed, stop):
    r = random.Random(seed)
    while time.time() < stop:
        n = r.choice([5, 50, 300, 1000, 2500])
        text = (r.choice(prefixes) + " " if r.random() < 0.5 else "") + " ".join(r.choices(words, k=n))
        body = {"max_tokens": r.choice([1, 8, 64, 200]), "temperature": r.choice([0, 0.8]),
                "stream": r.random() < 0.5}
        if r.random() < 0.5:
            path, body["prompt"] = "/v1/completions", text
        else:
            path, body["messages"] = "/v1/chat/completions", [{"role": "user", "content": text}]
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            answer = c.getresponse()
            if body["stream"] and r.random() < 0.3:
                answer.read(200)  # hangs up mid-stream
            else:
                answer.read()
            c.close()
        except OSError as e:
            print("request failed:", e, file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qhx", default="build/qhx")
    ap.add_argument("--model", default="models/qwen3-kjv")
    ap.add_argument("--text", default="models/qwen3.5-kjv/held_out.txt")
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("serve_args", nargs="*", help="more `qhx serve` arguments (after --)")
    a = ap.parse_args()
    server = subprocess.Popen([a.qhx, "serve", "--model", a.model, "--port", "0", "-t",
                               str(a.threads)] + a.serve_args,
                              stderr=subprocess.PIPE, text=True)
    estimate = port = None
    for line in server.stderr:
        sys.stderr.write(line)
        if m := re.search(r"memory estimate ([0-9.]+) MB", line):
            estimate = float(m.group(1))
        if m := re.search(r"listening on http://[^:]+:(\d+)", line):
            port = int(m.group(1))
            break
    if port is None:
        sys.exit("qhx serve did not start")
    threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
    words = open(a.text).read().split()
    prefixes = [" ".join(random.Random(i).sample(words, 200)) for i in range(6)]
    stop = time.time() + a.seconds
    clients = [threading.Thread(target=client, args=(port, words, prefixes, i, stop))
               for i in range(a.clients)]
    for t in clients:
        t.start()
    start, peak = time.time(), 0.0
    while any(t.is_alive() for t in clients):
        now = rss_mb(server.pid)
        peak = max(peak, now)
        print(f"{time.time() - start:6.0f} s  RSS {now:7.1f} MB  peak {peak:7.1f} MB", flush=True)
        time.sleep(10)
    end = rss_mb(server.pid)
    server.terminate()
    server.wait()
    if estimate is None:
        sys.exit(f"qhx serve printed no memory estimate; peak RSS {peak:.1f} MB")
    print(f"estimate {estimate:.1f} MB, peak RSS {peak:.1f} MB, at the end {end:.1f} MB")
    sys.exit(0 if peak <= estimate else 1)


if __name__ == "__main__":
    main()
