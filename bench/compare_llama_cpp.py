#!/usr/bin/env python3
"""Side-by-side speed of qhx and llama.cpp on the same synthetic weights, same threads.

What it does, each step skipped when its output is already in the cache:
  1. llama.cpp: `pip download --no-deps --no-binary :all: llama-cpp-python==VERSION` (PyPI's sdist
     vendors a full llama.cpp tree), unpacked and built with cmake (Release, CPU only,
     GGML_NATIVE=ON, static, no OpenSSL/curl): llama-bench and llama-quantize.
  2. A venv for the GGUF conversion. The default converter is bench/hf_to_gguf_numpy.py (numpy and
     the vendored gguf-py; writes what llama.cpp's converter writes for Qwen3 / Qwen3.5, checked by
     --check-converter). llama.cpp's convert_hf_to_gguf.py needs torch + transformers + sentencepiece
     (several GB, CUDA wheels on PyPI): use it with --converter official --python PY.
  3. `qhx forge synth --preset P` (random weights, real shapes) + the Qwen3 tokenizer files, then
     GGUF Q8_0 (and Q4_0 via a BF16 GGUF and llama-quantize) and qhx bundles W8 (and W4) from that
     one checkpoint. Layouts are matched: the tied embedding/output table is Q8_0 in both GGUFs
     (llama-quantize --token-embedding-type q8_0; --q4-table stock keeps llama.cpp's Q6_K) and
     int8 (w8) in both qhx bundles; qhx W4 uses its default groups of 64 (--w4-group-size).
  4. Rounds of llama-bench (-p/-n/-t/-r, JSON) and `qhx bench --json`, alternating
     (llama.cpp, qhx, llama.cpp, qhx, ...), then a table of prefill and decode tok/s and the
     ratio qhx / llama.cpp (mean ± sample stddev over rounds, each round's figure being the mean
     over -r repetitions). -p takes several prompt lengths (-p 512,2048: rows pp512, pp2048 and
     tg128); both tools time the decode from an empty context, qhx's figure being that of its
     first prompt length's record.

Examples (from the repository root, after `tools/setup.sh build`):
  python3 bench/compare_llama_cpp.py --preset qwen3-0.6b -p 64 -n 16 -r 1 --rounds 1   # smoke
  python3 bench/compare_llama_cpp.py --preset qwen3-0.6b --rounds 3 --json out.json --markdown out.md
  python3 bench/compare_llama_cpp.py --preset qwen3.5-2b --pairs q8
  python3 bench/compare_llama_cpp.py --setup-only              # download + build llama.cpp only
  python3 bench/compare_llama_cpp.py --list-converter-archs    # what the vendored converter takes
  python3 bench/compare_llama_cpp.py --vulkan --preset qwen3.5-2b --pairs q8   # GPU against GPU

--vulkan compares the GPUs: llama.cpp built with GGML_VULKAN=ON (its own build directory) and run
with every layer offloaded (-ngl 99), against `qhx bench --device vulkan --decode-device D`
(--qhx-decode-device, default vulkan: both decode on the GPU). Each record carries the device,
driver and backends that produced it (llama-bench's "backends" and "gpu_info", qhx's "backends").
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VERSION = "0.3.36"  # llama-cpp-python; vendors ggml-org/llama.cpp@0c1e57098
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qhx-llama-cpp"
NUMPY_CONVERTER = Path(__file__).resolve().parent / "hf_to_gguf_numpy.py"
VENV_PACKAGES = ["numpy>=2.2.6", "pyyaml>=5.1", "tqdm>=4.27"]  # gguf-py's imports

# A pair: the GGUF type on the llama.cpp side and the qhx bundle weights on the other.
PAIRS = {
    "q8": {"gguf": "Q8_0", "qhx": "w8", "label": "Q8_0 vs W8"},
    "q4": {"gguf": "Q4_0", "qhx": "w4", "label": "Q4_0 vs W4"},
}
HF_ARCHS = {"qwen3": "Qwen3ForCausalLM", "qwen3.5": "Qwen3_5ForCausalLM"}


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> None:
    print(f"compare_llama_cpp.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def run(cmd: list, nice: int | None = None, capture: bool = False, **kw) -> subprocess.CompletedProcess:
    cmd = [str(c) for c in cmd]
    if nice is not None and shutil.which("nice"):
        cmd = ["nice", "-n", str(nice)] + cmd
    log("$ " + shlex.join(cmd))
    if capture:
        result = subprocess.run(cmd, capture_output=True, text=True, **kw)
    else:  # the tool's own output goes to stderr: stdout is for the results
        result = subprocess.run(cmd, stdout=sys.stderr, text=True, **kw)
    if result.returncode != 0:
        if capture:
            sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        die(f"command failed (exit {result.returncode}): {shlex.join(cmd)}")
    return result


def timed(fn, *args, **kw):
    start = time.monotonic()
    value = fn(*args, **kw)
    return value, time.monotonic() - start


# ---------------------------------------------------------------------------------------------
# llama.cpp from the llama-cpp-python sdist

class LlamaCpp:
    def __init__(self, cache: Path, version: str, src: Path | None, vulkan: bool = False,
                 portable: bool = False, cmake_args: list[str] | None = None):
        self.cache, self.version, self.vulkan, self.portable = cache, version, vulkan, portable
        self.cmake_args = cmake_args or []
        self.sdist_dir = cache / "src" / f"llama_cpp_python-{version}"
        self.src = src or self.sdist_dir / "vendor" / "llama.cpp"
        tag = f"{version}" if src is None else "custom-" + re.sub(r"[^A-Za-z0-9]+", "-", str(src))
        self.build = cache / (f"build-{tag}" + ("-vulkan" if vulkan else "")
                              + ("-portable" if portable else ""))
        self.bench = self.build / "bin" / "llama-bench"
        self.quantize = self.build / "bin" / "llama-quantize"
        self.timings: dict[str, float] = {}

    def fetch(self) -> None:
        if (self.src / "CMakeLists.txt").exists():
            return
        dl = self.cache / "dl"
        sdist = dl / f"llama_cpp_python-{self.version}.tar.gz"
        if not sdist.exists():
            _, self.timings["download_s"] = timed(
                run, [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                      f"llama-cpp-python=={self.version}", "-d", dl])
        if not sdist.exists():
            die(f"pip did not leave {sdist}")
        log(f"unpacking {sdist}")
        (self.cache / "src").mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(self.cache / "src", filter="data")
        if not (self.src / "CMakeLists.txt").exists():
            die(f"the sdist has no vendored llama.cpp at {self.src}")

    def commit(self) -> str:
        """The llama.cpp commit that this llama-cpp-python release vendors (from its CHANGELOG)."""
        changelog = self.sdist_dir / "CHANGELOG.md"
        if changelog.exists():
            text = changelog.read_text(encoding="utf-8", errors="replace")
            section = text.split(f"## [{self.version}]", 1)[-1].split("\n## [", 1)[0]
            m = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section)
            if m:
                return m.group(1)
        return "unknown"

    def build_tools(self, jobs: int, nice: int, rebuild: bool) -> None:
        if self.bench.exists() and self.quantize.exists() and not rebuild:
            return
        # A portable build runs on any x86-64 with AVX2 (a lent GPU machine, built elsewhere).
        cpu = (["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
                "-DGGML_F16C=ON", "-DGGML_BMI2=ON"] if self.portable else ["-DGGML_NATIVE=ON"])
        flags = ["-DCMAKE_BUILD_TYPE=Release", *cpu, "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DGGML_CUDA=OFF",
                 "-DGGML_VULKAN=" + ("ON" if self.vulkan else "OFF"), "-DGGML_METAL=OFF",
                 *self.cmake_args]
        start = time.monotonic()
        run(["cmake", "-S", self.src, "-B", self.build, *flags], nice=nice, capture=True)
        run(["cmake", "--build", self.build, "-j", jobs, "--target", "llama-bench", "llama-quantize"],
            nice=nice)
        self.timings["build_s"] = time.monotonic() - start
        (self.build / "qhx-build.json").write_text(json.dumps(
            {"build_s": self.timings["build_s"], "jobs": jobs, "cmake_flags": flags}, indent=1))
        log(f"llama.cpp built in {self.timings['build_s']:.0f} s")

    def recorded_build_s(self) -> float | None:
        f = self.build / "qhx-build.json"
        return json.loads(f.read_text()).get("build_s") if f.exists() else None

    def supports(self, hf_arch: str) -> bool:
        """Does the converter register the architecture (and llama.cpp know its GGUF arch)?"""
        return hf_arch in converter_archs(self.src)

    def runtime_knows_qwen35(self) -> bool:
        arch_h = self.src / "src" / "llama-arch.h"
        return arch_h.exists() and "LLM_ARCH_QWEN35," in arch_h.read_text(errors="replace")


def converter_archs(src: Path) -> list[str]:
    """Hugging Face architectures registered with @ModelBase.register in the converter's sources."""
    files = [src / "convert_hf_to_gguf.py", *sorted((src / "conversion").glob("*.py"))]
    names: set[str] = set()
    for f in files:
        if not f.exists():
            continue
        for block in re.findall(r"@ModelBase\.register\(([^)]*)\)", f.read_text(errors="replace")):
            names.update(re.findall(r'"([^"]+)"', block))
    return sorted(names)


# ---------------------------------------------------------------------------------------------
# conversion venv

def ensure_venv(cache: Path, nice: int, python: str | None) -> Path:
    if python:  # an interpreter that has gguf-py's imports already (a machine without PyPI)
        probe = subprocess.run([python, "-c", "import numpy, yaml, tqdm"], capture_output=True,
                               text=True)
        if probe.returncode != 0:
            die(f"--converter-python {python} cannot import numpy, yaml and tqdm (gguf-py's imports)")
        return Path(python)
    venv = cache / "venv"
    python = venv / "bin" / "python"
    stamp = venv / ".qhx-ready"
    if stamp.exists() and python.exists():
        return python
    run([sys.executable, "-m", "venv", venv])
    run([python, "-m", "pip", "install", "--quiet", *VENV_PACKAGES], nice=nice)
    stamp.write_text("\n".join(VENV_PACKAGES) + "\n")
    return python


def check_official_python(python: str) -> None:
    probe = subprocess.run([python, "-c", "import torch, transformers, numpy, sentencepiece"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        die(f"{python} cannot run llama.cpp's convert_hf_to_gguf.py: it imports torch, transformers, "
            f"numpy and sentencepiece at start-up ({probe.stderr.strip().splitlines()[-1]}). "
            "Give --python an interpreter that has them, or use the default numpy converter.")


# ---------------------------------------------------------------------------------------------
# models

def find_tokenizer(explicit: Path | None) -> Path:
    candidates = [explicit] if explicit else [REPO / "tests/fixtures/tokenizer/qwen3"]
    for c in candidates:
        if c and (c / "tokenizer.json").exists():
            return c
    die("no Qwen3 tokenizer found (tokenizer.json + tokenizer_config.json); give --tokenizer DIR")
    raise AssertionError


class Models:
    """One synthetic checkpoint and everything converted from it, under work/<preset>/."""

    def __init__(self, args, llama: LlamaCpp, qhx: Path, python: Path):
        self.args, self.llama, self.qhx, self.python = args, llama, qhx, python
        self.dir = args.work / args.preset
        self.ckpt = self.dir / "checkpoint"
        self.timings: dict[str, float] = {}

    def _step(self, key: str, out: Path, fn) -> Path:
        if out.exists() and not self.args.fresh:
            return out
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        _, self.timings[key] = timed(fn)
        log(f"{key}: {self.timings[key]:.1f} s")
        return out

    def checkpoint(self) -> Path:
        def make():
            self.dir.mkdir(parents=True, exist_ok=True)
            run([self.qhx, "forge", "synth", "--preset", self.args.preset, "-o", self.ckpt,
                 "--seed", self.args.seed], nice=self.args.nice)
            tok = find_tokenizer(self.args.tokenizer)
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(tok / name, self.ckpt / name)
        return self._step("synth_checkpoint_s", self.ckpt, make)

    def gguf(self, outtype: str, converter: str | None = None) -> Path:
        converter = converter or self.args.converter
        suffix = "" if converter == "numpy" else "-official"
        out = self.dir / f"model-{outtype}{suffix}.gguf"

        def make():
            if converter == "numpy":
                run([self.python, NUMPY_CONVERTER, self.ckpt, "--llama-cpp", self.llama.src,
                     "--outtype", outtype, "--outfile", out, "--qhx", self.qhx],
                    nice=self.args.nice, capture=True)
            else:  # Qwen3.5 synth checkpoints have no MTP layers: --no-mtp says so
                run([self.args.python, self.llama.src / "convert_hf_to_gguf.py", self.ckpt,
                     "--outtype", outtype, "--outfile", out, *(["--no-mtp"] if self.hybrid() else [])],
                    nice=self.args.nice, capture=True)
        return self._step(f"convert_{outtype}_{converter}_s", out, make)

    def hybrid(self) -> bool:
        return self.args.preset.startswith("qwen3.5")

    def gguf_q4_0(self) -> Path:
        table = "" if self.args.q4_table == "stock" else "-table-q8_0"
        out = self.dir / f"model-q4_0{table}.gguf"

        def make():
            bf16 = self.gguf("bf16")
            cmd = [self.llama.quantize]
            if self.args.q4_table != "stock":
                cmd += ["--token-embedding-type", "q8_0", "--output-tensor-type", "q8_0"]
            run(cmd + [bf16, out, "Q4_0", self.args.threads], nice=self.args.nice, capture=True)
            if not self.args.keep_intermediate:
                bf16.unlink()
        return self._step("quantize_q4_0_s", out, make)

    def bundle(self, weights: str) -> Path:
        # The name carries every option that changes the bundle, so a cached one is never reused
        # for other settings (bundles from an older qhx: --fresh).
        group = f"-g{self.args.w4_group_size}" if weights == "w4" else ""
        out = self.dir / f"qhx-{weights}{group}-table-{self.args.qhx_table}"
        cmd = [self.qhx, "forge", "convert", self.ckpt, "-o", out, "--weights", weights,
               "--embed", self.args.qhx_table, "--lm-head", self.args.qhx_table, "--no-gate"]
        if weights == "w4":
            cmd += ["--group-size", self.args.w4_group_size]
        return self._step(f"qhx_convert_{weights}_s", out,
                          lambda: run(cmd, nice=self.args.nice, capture=True))


# ---------------------------------------------------------------------------------------------
# benchmarks

def test_names(args) -> list[str]:
    """The table's rows for one pair: pp<N> for each prompt length, then tg<n>."""
    return [f"pp{n}" for n in args.n_prompt] + [f"tg{args.n_gen}"]


def prompt_list(args) -> str:
    return ",".join(str(n) for n in args.n_prompt)


def qhx_device_args(args) -> list[str]:
    if not args.vulkan:
        return []
    return ["--device", "vulkan", "--decode-device", args.qhx_decode_device,
            "--device-check", args.qhx_device_check]


def llama_bench(llama: LlamaCpp, gguf: Path, args) -> dict:
    """tok/s per test name (and its stddev over -r), from llama-bench's JSON records."""
    cmd = [llama.bench, "-m", gguf, "-p", prompt_list(args), "-n", args.n_gen, "-t", args.threads,
           "-r", args.reps, "-o", "json", *(["-ngl", "99"] if args.vulkan else []),
           *args.llama_bench_args]
    records = json.loads(run(cmd, capture=True).stdout)
    out = {"raw": records, "tok_s": {}, "sd": {}}
    for r in records:
        if r["n_prompt"] > 0 and r["n_gen"] == 0:
            test = f"pp{r['n_prompt']}"
        elif r["n_gen"] > 0 and r["n_prompt"] == 0:
            test = f"tg{r['n_gen']}"
        else:
            continue
        out["tok_s"][test], out["sd"][test] = r["avg_ts"], r["stddev_ts"]
    missing = [t for t in test_names(args) if t not in out["tok_s"]]
    if missing:
        die(f"llama-bench on {gguf}: no record for {', '.join(missing)}")
    return out


def qhx_bench(qhx: Path, bundle: Path, args) -> dict:
    """tok/s per test name from `qhx bench --json` (one record per prompt length)."""
    cmd = [qhx, "bench", bundle, "-p", prompt_list(args), "-n", args.n_gen, "-t", args.threads,
           "-r", args.reps, "--json", *qhx_device_args(args)]
    result = run(cmd, capture=True)
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if args.vulkan:  # a device that failed its check leaves the run to the CPU: no GPU figure
        wanted = {"prefill_device": "vulkan", "decode_device": args.qhx_decode_device}
        for r in records:
            for key, kind in wanted.items():
                if not str(r.get(key)).startswith(kind):
                    die(f"qhx bench on {bundle}: ran its {key.split('_')[0]} on {r.get(key)}, not "
                        f"{kind} (--qhx-device-check never times a device that fails its "
                        f"check):\n{result.stderr.strip()}")
    by_prompt = {r["n_prompt"]: r for r in records}
    missing = [n for n in args.n_prompt if n not in by_prompt]
    if missing:
        die(f"qhx bench on {bundle}: no record for -p {', '.join(map(str, missing))}")
    out = {"raw": records, "tok_s": {}, "sd": {}}
    for n in args.n_prompt:
        r = by_prompt[n]
        out["tok_s"][f"pp{n}"] = r["prefill_tok_s"]
        out["sd"][f"pp{n}"] = r["spread"]["prefill_tok_s"]["stddev"]
    first = by_prompt[args.n_prompt[0]]  # its decode, from an empty context as llama-bench's
    out["tok_s"][f"tg{args.n_gen}"] = first["decode_tok_s"]
    out["sd"][f"tg{args.n_gen}"] = first["spread"]["decode_tok_s"]["stddev"]
    return out


def qhx_profile(qhx: Path, bundle: Path, args, stem: Path) -> None:
    """`qhx bench --profile` of one bundle with the rounds' -p/-n, once as its table (stem.txt)
    and once as JSON (stem.json): where the device's time went in those runs, per op."""
    cmd = [qhx, "bench", bundle, "-p", prompt_list(args), "-n", args.n_gen, "-t", args.threads,
           "-r", "1", "--profile", *qhx_device_args(args)]
    Path(f"{stem}.txt").write_text(run(cmd, capture=True).stdout)
    Path(f"{stem}.json").write_text(run(cmd + ["--json"], capture=True).stdout)
    log(f"wrote {stem}.txt and {stem}.json")


def spread(xs: list[float]) -> dict:
    return {"mean": statistics.fmean(xs), "stddev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs), "n": len(xs)}


def cell(s: dict, digits: int = 1) -> str:
    return f"{s['mean']:.{digits}f} ± {s['stddev']:.{digits}f}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni",
                                    "avx512_bf16", "avx_vnni") if f in have]
    except OSError:
        pass
    return []


def git_commit() -> str:
    if os.environ.get("QHX_COMMIT"):  # a tree without .git (a copy sent to another machine)
        return os.environ["QHX_COMMIT"]
    r = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (r.stdout.strip() or "unknown") + ("-dirty" if dirty else "")


def render_table(rows: list[dict], args) -> str:
    lines = ["| pair | test | llama.cpp tok/s | qhx tok/s | qhx / llama.cpp | best of rounds: "
             "llama.cpp, qhx, ratio |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        for test in test_names(args):
            m = row["tests"][test]
            best_l, best_q = m["llama"]["max"], m["qhx"]["max"]
            lines.append(f"| {row['label']} | {test} | {cell(m['llama'])} | {cell(m['qhx'])} | "
                         f"{cell(m['ratio'], 2)} | {best_l:.1f}, {best_q:.1f}, "
                         f"{best_q / best_l:.2f} |")
    for row in rows:
        b = row.get("qhx_decode_bandwidth")
        if b:
            of = (f"the memory's read bandwidth, {cell(b['memory_read_gb_s'])} GB/s on "
                  f"{args.threads} threads" if b["read_by"] == "cpu" else
                  f"{b['read_by']}'s measured read peak, {cell(b['memory_read_gb_s'])} GB/s")
            lines.append(f"\nqhx {row['label'].split(' vs ')[-1]} decode read "
                         f"{100 * b['fraction']['mean']:.0f} ± {100 * b['fraction']['stddev']:.0f} % "
                         f"of {of} (qhx bench, same runs).")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_argument_group("what to compare")
    g.add_argument("--preset", default="qwen3-0.6b",
                   help="qhx forge synth preset: qwen3-0.6b, qwen3-1.7b, qwen3.5-0.8b, qwen3.5-2b, "
                        "qwen3.5-4b (default: %(default)s)")
    g.add_argument("--pairs", default=None,
                   help="comma-separated from q8 (GGUF Q8_0 vs qhx W8), q4 (Q4_0 vs W4); default: "
                        "q8,q4 for Qwen3 presets, q8 for Qwen3.5")
    g.add_argument("-p", "--n-prompt", default="512",
                   help="prefill tokens, comma-separated for several (default: 512)")
    g.add_argument("-n", "--n-gen", type=int, default=128, help="decoded tokens (default: 128)")
    g.add_argument("-t", "--threads", type=int, default=2, help="threads for both (default: 2)")
    g.add_argument("-r", "--reps", type=int, default=3,
                   help="repetitions inside each llama-bench / qhx bench call (default: 3)")
    g.add_argument("--rounds", type=int, default=3,
                   help="alternating llama.cpp / qhx rounds; the table's spread is over these "
                        "(default: 3)")
    g.add_argument("--q4-table", choices=["q8_0", "stock"], default="q8_0",
                   help="Q4_0 GGUF's tied embedding/output table: q8_0 (matches the qhx bundle's "
                        "int8 table; default) or stock (llama-quantize's own choice, Q6_K)")
    g.add_argument("--qhx-table", default="w8",
                   help="qhx bundles' embedding and lm_head dtype (default: w8, like Q8_0's)")
    g.add_argument("--w4-group-size", type=int, default=64,
                   help="qhx W4 group width (default: 64, qhx's default; int8 activations need a "
                        "multiple of 64, so 32 (Q4_0's block) runs W4 with f32 activations)")
    g.add_argument("--llama-bench-args", default="",
                   help="extra llama-bench arguments, one string (e.g. '-fa on -ub 256')")
    g.add_argument("--llama-cmake-args", default="",
                   help="extra cmake arguments for llama.cpp's build, one string (e.g. a newer "
                        "glslc: '-DVulkan_GLSLC_EXECUTABLE=PATH'); a cached build is not redone "
                        "for them (--rebuild)")
    g.add_argument("--vulkan", action="store_true",
                   help="GPU against GPU: llama.cpp's Vulkan backend (-ngl 99) and qhx --device vulkan")
    g.add_argument("--qhx-device-check", choices=["once", "always", "never"], default="once",
                   help="--vulkan: qhx's check of the device before use (default: once). Random "
                        "weights can fail it where trained ones pass: the hybrid's int8 "
                        "activations carry a float rounding's step through its recurrence "
                        "(bench/gpu_check.sh checks the device on the fixtures instead)")
    g.add_argument("--qhx-decode-device", choices=["vulkan", "cpu"], default="vulkan",
                   help="with --vulkan: where qhx decodes (default: vulkan)")
    g = ap.add_argument_group("tools and caches")
    g.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                   help="download, build, venv (default: %(default)s)")
    g.add_argument("--work", type=Path, default=None,
                   help="checkpoints, GGUFs and bundles, per preset (default: CACHE/models)")
    g.add_argument("--llama-cpp-python-version", default=DEFAULT_VERSION,
                   help="PyPI llama-cpp-python sdist to take llama.cpp from (default: %(default)s)")
    g.add_argument("--llama-cpp-src", type=Path, default=None,
                   help="use this llama.cpp source tree instead of the sdist's")
    g.add_argument("--qhx", type=Path, default=REPO / "build" / "qhx",
                   help="qhx binary (default: build/qhx; make it with tools/setup.sh build)")
    g.add_argument("--tokenizer", type=Path, default=None,
                   help="directory with the Qwen3 tokenizer.json + tokenizer_config.json "
                        "(default: tests/fixtures/tokenizer/qwen3)")
    g.add_argument("--converter", choices=["numpy", "official"], default="numpy",
                   help="numpy: bench/hf_to_gguf_numpy.py in CACHE/venv (default); official: "
                        "llama.cpp's convert_hf_to_gguf.py run by --python")
    g.add_argument("--converter-python", default=None,
                   help="run the numpy converter with this interpreter (it must import numpy, yaml, "
                        "tqdm) instead of a venv made from PyPI")
    g.add_argument("--portable-cpu", action="store_true",
                   help="build llama.cpp for any x86-64 with AVX2 instead of this CPU (GGML_NATIVE=OFF), "
                        "in a build directory of its own: for a build carried to another machine")
    g.add_argument("--python", default=None,
                   help="interpreter with torch, transformers, numpy, sentencepiece for the official "
                        "converter")
    g.add_argument("--check-converter", action="store_true",
                   help="also convert with the official converter (--python) and compare the two "
                        "Q8_0 GGUFs tensor by tensor")
    g.add_argument("--seed", type=int, default=1, help="forge synth seed (default: 1)")
    g.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="build jobs")
    g.add_argument("--nice", type=int, default=10,
                   help="niceness of builds and conversions (benchmarks run at normal priority)")
    g.add_argument("--fresh", action="store_true", help="redo the checkpoint and conversions")
    g.add_argument("--rebuild", action="store_true", help="rebuild llama.cpp")
    g.add_argument("--keep-intermediate", action="store_true",
                   help="keep the BF16 GGUF (Q4_0's source) and --check-converter's official GGUF")
    g = ap.add_argument_group("output and modes")
    g.add_argument("--json", type=Path, help="write the results (all rounds, metadata) here")
    g.add_argument("--qhx-profile", type=Path, metavar="DIR",
                   help="after the rounds, qhx bench --profile of each pair's bundle with the same "
                        "-p/-n (needs --vulkan): DIR/profile-PRESET-WEIGHTS.txt and .json")
    g.add_argument("--markdown", type=Path, help="write the table and metadata here")
    g.add_argument("--setup-only", action="store_true", help="fetch and build llama.cpp, then stop")
    g.add_argument("--convert-only", action="store_true", help="stop after making the models")
    g.add_argument("--list-converter-archs", action="store_true",
                   help="print the Hugging Face architectures the vendored converter registers")
    args = ap.parse_args()
    args.work = args.work or args.cache / "models"
    args.llama_bench_args = shlex.split(args.llama_bench_args)
    args.llama_cmake_args = shlex.split(args.llama_cmake_args)
    family = "qwen3.5" if args.preset.startswith("qwen3.5") else "qwen3"
    args.hf_arch = HF_ARCHS[family]
    args.pairs = (args.pairs or ("q8" if family == "qwen3.5" else "q8,q4")).split(",")
    for p in args.pairs:
        if p not in PAIRS:
            ap.error(f"--pairs: unknown pair {p!r} (q8, q4)")
    if args.converter == "official" or args.check_converter:
        if not args.python:
            ap.error("--converter official and --check-converter need --python (an interpreter "
                     "with torch, transformers, numpy, sentencepiece)")
    try:
        args.n_prompt = [int(n) for n in args.n_prompt.split(",")]
    except ValueError:
        ap.error(f"-p: expected prompt lengths separated by commas, got {args.n_prompt!r}")
    if len(set(args.n_prompt)) != len(args.n_prompt):
        ap.error("-p: a prompt length is given twice")
    if args.qhx_profile and not args.vulkan:
        ap.error("--qhx-profile times the GPU's work: it needs --vulkan")
    if min(*args.n_prompt, args.n_gen, args.threads, args.reps, args.rounds) < 1:
        ap.error("-p, -n, -t, -r and --rounds must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    llama = LlamaCpp(args.cache, args.llama_cpp_python_version, args.llama_cpp_src, args.vulkan,
                     args.portable_cpu, args.llama_cmake_args)
    llama.fetch()
    if args.list_converter_archs:
        print("\n".join(converter_archs(llama.src)))
        return
    llama.build_tools(args.jobs, args.nice, args.rebuild)
    if args.setup_only:
        log(f"llama-bench: {llama.bench}\nllama-quantize: {llama.quantize}")
        return

    if not llama.supports(args.hf_arch) or (args.hf_arch == "Qwen3_5ForCausalLM"
                                             and not llama.runtime_knows_qwen35()):
        die(f"the llama.cpp vendored by llama-cpp-python {args.llama_cpp_python_version} "
            f"(commit {llama.commit()}) does not support {args.hf_arch}: its converter does not "
            "register it or its runtime has no such architecture; nothing to compare for "
            f"--preset {args.preset}")
    if not args.qhx.exists():
        die(f"no qhx binary at {args.qhx}: build it with tools/setup.sh build, or give --qhx")
    python = ensure_venv(args.cache, args.nice, args.converter_python)
    if args.python:
        check_official_python(args.python)

    models = Models(args, llama, args.qhx.resolve(), python)
    models.checkpoint()
    pairs = []
    for p in args.pairs:
        gguf = models.gguf("q8_0") if p == "q8" else models.gguf_q4_0()
        pairs.append({"pair": p, **PAIRS[p], "gguf_path": gguf, "bundle": models.bundle(PAIRS[p]["qhx"])})
    converter_check = None
    if args.check_converter:
        official = models.gguf("q8_0", converter="official")
        numpy_q8 = models.gguf("q8_0", converter="numpy")
        r = subprocess.run([python, NUMPY_CONVERTER, "--compare", numpy_q8, official,
                            "--llama-cpp", llama.src], capture_output=True, text=True)
        converter_check = {"identical": r.returncode == 0, "report": r.stdout.strip()}
        log("converter check: " + r.stdout.strip().replace("\n", "\n  "))
        if not args.keep_intermediate:
            official.unlink()
    if args.convert_only:
        return

    load_start = os.getloadavg()
    if load_start[0] > 0.5:
        log(f"warning: load average {load_start[0]:.2f} before the runs; other work on the CPU "
            "slows both, llama.cpp's spinning OpenMP threads much more than qhx")
    rounds: dict[str, list] = {p["pair"]: [] for p in pairs}
    for i in range(args.rounds):
        for p in pairs:
            log(f"round {i + 1}/{args.rounds}, {p['label']}")
            load = os.getloadavg()[0]
            lb = llama_bench(llama, p["gguf_path"], args)
            qb = qhx_bench(args.qhx, p["bundle"], args)
            rounds[p["pair"]].append({"llama": lb, "qhx": qb, "load_1min_before": load})
            log("  " + " | ".join(f"{t} llama.cpp {lb['tok_s'][t]:.1f} qhx {qb['tok_s'][t]:.1f}"
                                  for t in test_names(args)) + " tok/s")

    if args.qhx_profile:
        args.qhx_profile.mkdir(parents=True, exist_ok=True)
        for p in pairs:
            qhx_profile(args.qhx, p["bundle"], args,
                        args.qhx_profile / f"profile-{args.preset}-{PAIRS[p['pair']]['qhx']}")

    rows = []
    for p in pairs:
        rr = rounds[p["pair"]]
        row = {"pair": p["pair"], "label": p["label"], "gguf": p["gguf_path"].name,
               "bundle": p["bundle"].name, "tests": {}}
        for test in test_names(args):
            ll = [r["llama"]["tok_s"][test] for r in rr]
            qq = [r["qhx"]["tok_s"][test] for r in rr]
            row["tests"][test] = {"llama": spread(ll), "qhx": spread(qq),
                                  "ratio": spread([q / l for q, l in zip(qq, ll)])}
        # qhx bench's own measure of the memory's read bandwidth and of the share its decode used.
        fractions = [r["qhx"]["raw"][0].get("decode_bandwidth_fraction") for r in rr]
        ceilings = [r["qhx"]["raw"][0].get("memory_read_gb_s") for r in rr]
        if all(f is not None for f in fractions) and all(c is not None for c in ceilings):
            row["qhx_decode_bandwidth"] = {
                "fraction": spread(fractions), "memory_read_gb_s": spread(ceilings),
                "read_by": rr[0]["qhx"]["raw"][0].get("memory_read_by", "cpu")}
        rows.append(row)

    first = rounds[pairs[0]["pair"]][0]
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "qhx_commit": git_commit(),
        "qhx_binary_commit": first["qhx"]["raw"][0].get("commit"),
        "qhx_kernel_path": first["qhx"]["raw"][0].get("kernel_path"),
        "llama_cpp_python": args.llama_cpp_python_version if not args.llama_cpp_src else None,
        "llama_cpp_commit": llama.commit() if not args.llama_cpp_src else str(args.llama_cpp_src),
        "llama_bench_backends": first["llama"]["raw"][0].get("backends"),
        "llama_bench_gpu": first["llama"]["raw"][0].get("gpu_info"),
        "qhx_backends": first["qhx"]["raw"][0].get("backends"),
        "qhx_devices": {"prefill": first["qhx"]["raw"][0].get("prefill_device"),
                        "decode": first["qhx"]["raw"][0].get("decode_device")},
        "cpu": cpu_model(), "cpu_flags": cpu_flags(), "threads": args.threads,
        "preset": args.preset, "n_prompt": args.n_prompt, "n_gen": args.n_gen,
        "reps_per_call": args.reps, "rounds": args.rounds, "converter": args.converter,
        "q4_table": args.q4_table, "qhx_table": args.qhx_table, "w4_group_size": args.w4_group_size,
        "llama_bench_args": args.llama_bench_args, "load_average_start": load_start,
        "load_average": os.getloadavg(),
        "llama_cpp_build_s": llama.timings.get("build_s", llama.recorded_build_s()),
        "step_timings_s": {**llama.timings, **models.timings},
        "converter_check": converter_check,
    }
    table = render_table(rows, args)
    header = (f"{meta['date']}  qhx {meta['qhx_commit'][:12]} ({meta['qhx_kernel_path']})  "
              f"llama.cpp {meta['llama_cpp_commit']} (llama-cpp-python {meta['llama_cpp_python']})\n"
              f"{meta['cpu']} [{' '.join(meta['cpu_flags'])}], {args.threads} threads, "
              f"preset {args.preset}, {' / '.join(test_names(args))}, "
              f"{args.rounds} round(s) x {args.reps} rep(s), load average at the end "
              f"{' '.join(f'{x:.2f}' for x in meta['load_average'])}")
    note = ("mean ± sample stddev over rounds; the ratio is taken per round (> 1: qhx faster). "
            "Other load only slows a run, so on a shared machine the best round is the better "
            "estimate of each tool's speed.")
    print(header)
    print(table)
    print(note)
    if args.json:
        result = {"meta": meta, "rows": rows, "rounds": rounds}
        args.json.write_text(json.dumps(result, indent=1, default=str) + "\n")
        log(f"wrote {args.json}")
    if args.markdown:
        args.markdown.write_text(f"```\n{header}\n```\n\n{table}\n\n{note}\n")
        log(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
