"""`dspark serve` against `dspark generate` on the same model, prompt and length (greedy), on
the GPU machine. Only the standard library (no openai client needed). Run by
scripts/serve-bench.sh, which documents the settings; every setting comes from the environment:

  DSPARK   the dspark binary (default .gpu-bundle/dspark)
  TARGET   target folder (default: the embedded demo pair); needs tokenizer.json to serve
  DRAFT    draft folder (optional)
  DEVICE   cuda (default) or cpu
  PROMPT_TOKENS  prompt length in random token ids (default 512); PROMPT=text uses text instead
  N        tokens to generate (default 256)
  RUNS     streamed requests measured after one warm-up (default 3)
  OUT      folder for the logs (default ./serve-bench-logs)
  CLIENTS  concurrent streaming clients after the solo runs (default 1: none); each sends RUNS
           requests, and the summary's "load" gives aggregate tok/s, time to first token and
           inter-token latency (p50 / p99), and whether every stream's tokens equal generate's
  MAX_BATCH  `serve --max-batch` (default 1: one request at a time)

1. `dspark generate --json` (GPU memory polled with nvidia-smi while it runs): prefill ms,
   decode tok/s, tokens.
2. `dspark serve` with the same model on a free port; /health polled until 200; the server's GPU
   memory read while idle.
3. One warm-up request, then RUNS streamed /v1/completions requests (temperature 0,
   max_tokens N, stream_options.include_usage), each timed on the client: time to the first
   streamed token, streamed tokens/s after it, total; the server's GPU memory read during the
   last of them.
4. One line of JSON: the numbers of both, the ratio server tok/s / generate tok/s, the first
   token's ms minus generate's prefill ms, and whether the greedy tokens were equal.
"""

import http.client
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env(name, default=None):
    v = os.environ.get(name)
    return v if v not in (None, "") else default


DSPARK = env("DSPARK", os.path.join(ROOT, ".gpu-bundle/dspark"))
TARGET = env("TARGET")
DRAFT = env("DRAFT")
DEVICE = env("DEVICE", "cuda")
N = int(env("N", "256"))
RUNS = int(env("RUNS", "3"))
CLIENTS = int(env("CLIENTS", "1"))
MAX_BATCH = int(env("MAX_BATCH", "1"))
OUT = env("OUT", os.path.join(os.getcwd(), "serve-bench-logs"))


def log(*a):
    print("serve-bench:", *a, file=sys.stderr, flush=True)


def model_args():
    a = []
    if TARGET:
        a += ["--target", TARGET]
    if DRAFT:
        a += ["--draft", DRAFT]
    return a + ["--device", DEVICE]


def prompt():
    """(generate's prompt flags, the request's prompt field, prompt length or None)."""
    text = env("PROMPT")
    if text is not None or not TARGET:
        text = text if text is not None else "def fibonacci(n):\n"
        return ["--prompt", text], text, None
    n = int(env("PROMPT_TOKENS", "512"))
    vocab = json.load(open(os.path.join(TARGET, "config.json")))["vocab_size"]
    rng = random.Random(1)
    ids = [rng.randrange(min(vocab, 151643)) for _ in range(n)]
    return ["--prompt-ids", ",".join(map(str, ids))], ids, n


class GpuMemory:
    """Polls `nvidia-smi --query-compute-apps` for one pid's memory (MiB): last and peak."""

    def __init__(self, pid):
        self.pid, self.peak, self.last, self.ok = pid, 0, 0, True
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def read(self):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=10,
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            self.ok = False
            return None
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0] == str(self.pid) and parts[1].isdigit():
                return int(parts[1])
        return 0

    def _run(self):
        while not self._stop.is_set() and self.ok:
            m = self.read()
            if m is not None:
                self.last = m
                self.peak = max(self.peak, m)
            self._stop.wait(0.1)

    def stop(self):
        self._stop.set()
        self._t.join()
        return self


def run_generate(pflags, plen):
    ctx = ["--max-context", str(plen + N + 64)] if plen else []
    cmd = [DSPARK, "generate", *model_args(), *pflags, "--max-tokens", str(N), *ctx, "--json"]
    log("generate:", " ".join(cmd[:2] + model_args()), f"max_tokens {N}")
    with open(os.path.join(OUT, "generate.json"), "w") as out, open(os.path.join(OUT, "generate.err"), "w") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err)
        mem = GpuMemory(p.pid)
        rc = p.wait()
        mem.stop()
    if rc != 0:
        sys.exit("generate failed:\n" + open(os.path.join(OUT, "generate.err")).read())
    g = json.load(open(os.path.join(OUT, "generate.json")))
    return g, mem.peak


def start_server(plen):
    ctx = ["--max-context", str(plen + N + 64)] if plen else []
    cmd = [DSPARK, "serve", *model_args(), "--port", "0", *ctx, "--max-batch", str(MAX_BATCH),
           "--max-queue", str(max(64, 2 * CLIENTS))]
    err = open(os.path.join(OUT, "serve.err"), "w+")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    t0 = time.monotonic()
    addr = None
    while addr is None:
        if p.poll() is not None:
            err.seek(0)
            sys.exit("serve exited:\n" + err.read())
        err.seek(0)
        m = re.search(r"dspark serve: listening on (http://\S+)", err.read())
        if m:
            addr = m.group(1)
        elif time.monotonic() - t0 > 60:
            p.kill()
            sys.exit("serve did not print its address in 60 s")
        time.sleep(0.05)
    u = urllib.parse.urlparse(addr)
    host, port = u.hostname, u.port
    while True:
        if p.poll() is not None:
            err.seek(0)
            sys.exit("serve exited while loading:\n" + err.read())
        try:
            c = http.client.HTTPConnection(host, port, timeout=5)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            if r.status == 200:
                break
        except OSError:
            pass
        if time.monotonic() - t0 > 900:
            p.kill()
            sys.exit("serve not healthy after 900 s")
        time.sleep(0.1)
    load_s = time.monotonic() - t0
    log(f"serve: healthy at {addr} after {load_s:.1f} s")
    return p, host, port, load_s


def stream(host, port, prompt_field, gaps=None):
    """One streamed greedy completion: (first token s, total s, tokens, dspark field, usage);
    with `gaps`, the seconds between consecutive text chunks are appended to it."""
    body = json.dumps({
        "prompt": prompt_field, "max_tokens": N, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    })
    c = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body, headers={"content-type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"request failed: {r.status} {r.read()!r}")
    first, dspark, usage, done, pieces = None, None, None, False, 0
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\n")
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            done = True
            break
        e = json.loads(data)
        for ch in e.get("choices") or []:
            if ch.get("text"):
                pieces += 1
                now = time.perf_counter() - t0
                if first is None:
                    first = now
                elif gaps is not None:
                    gaps.append(now - last)
                last = now
            if ch.get("finish_reason") is not None:
                dspark = e.get("dspark")
        if e.get("usage"):
            usage = e["usage"]
    total = time.perf_counter() - t0
    c.close()
    if not done:
        sys.exit("the stream ended without [DONE]")
    return first, total, dspark, usage


def pct(xs, p):
    xs = sorted(xs)
    return xs[round((len(xs) - 1) * p)] if xs else None


def concurrent(host, port, pfield, want):
    """CLIENTS threads, RUNS streamed requests each, all at once: aggregate tok/s over the wall
    time, first token and inter-token latency p50 / p99 (ms), tokens equal to generate's."""
    gaps, firsts, counts, equal, errors = [], [], [], [], []
    lock = threading.Lock()

    def client():
        for _ in range(RUNS):
            mine = []
            try:
                first, total, dspark, usage = stream(host, port, pfield, mine)
            except SystemExit as e:
                with lock:
                    errors.append(str(e))
                return
            with lock:
                gaps.extend(mine)
                firsts.append(first)
                counts.append((usage or {}).get("completion_tokens") or 0)
                equal.append((dspark or {}).get("tokens") == want)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ms = lambda x: x * 1e3 if x is not None else None
    load = {
        "clients": CLIENTS, "requests": len(counts), "errors": errors, "wall_s": wall,
        "aggregate_tokens_per_second": sum(counts) / wall,
        "first_token_ms_p50": ms(pct([f for f in firsts if f is not None], 0.5)),
        "first_token_ms_p99": ms(pct([f for f in firsts if f is not None], 0.99)),
        "inter_token_ms_p50": ms(pct(gaps, 0.5)), "inter_token_ms_p99": ms(pct(gaps, 0.99)),
        "tokens_match_generate": bool(equal) and all(equal),
    }
    log(f"load: {CLIENTS} clients x {RUNS}: {load['aggregate_tokens_per_second']:.1f} tok/s aggregate, "
        f"inter-token p50 {load['inter_token_ms_p50'] or 0:.1f} ms p99 {load['inter_token_ms_p99'] or 0:.1f} ms")
    return load


def main():
    os.makedirs(OUT, exist_ok=True)
    pflags, pfield, plen = prompt()
    g, gen_mem = run_generate(pflags, plen)
    gs = g["stats"]
    log(f"generate: prefill {gs['prefill_ms']:.1f} ms, decode {gs['tokens_per_second']:.1f} tok/s, "
        f"{gs['generated_tokens']} tokens, peak GPU memory {gen_mem} MiB")

    p, host, port, load_s = start_server(plen)
    try:
        mem = GpuMemory(p.pid)
        time.sleep(1.0)
        idle = mem.read() or 0
        stream(host, port, pfield)  # warm-up: CUDA graphs captured on first use
        runs = []
        for i in range(RUNS):
            first, total, dspark, usage = stream(host, port, pfield)
            toks = (usage or {}).get("completion_tokens") or len((dspark or {}).get("tokens", []))
            decode_s = total - first if first is not None else float("nan")
            runs.append({
                "first_token_ms": first * 1e3 if first is not None else None,
                "total_ms": total * 1e3,
                "tokens": toks,
                # After the first token: tokens 2..n over the time from the first to the last.
                "stream_tokens_per_second": (toks - 1) / decode_s if toks > 1 and decode_s > 0 else None,
                "tokens_match_generate": (dspark or {}).get("tokens") == g["tokens"],
                "mean_accepted_length": (dspark or {}).get("mean_accepted_length"),
            })
            log(f"run {i}: first token {runs[-1]['first_token_ms']:.1f} ms, "
                f"{runs[-1]['stream_tokens_per_second'] or 0:.1f} tok/s streamed, {toks} tokens")
        load = concurrent(host, port, pfield, g["tokens"]) if CLIENTS > 1 else None
        busy_peak = mem.stop().peak
    finally:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()

    def median(xs):
        xs = sorted(x for x in xs if x is not None)
        return xs[len(xs) // 2] if xs else None

    tps = median(r["stream_tokens_per_second"] for r in runs)
    ttft = median(r["first_token_ms"] for r in runs)
    summary = {
        "target": TARGET or "demo", "draft": DRAFT, "device": DEVICE, "prompt_tokens": gs["prompt_tokens"],
        "max_tokens": N, "runs": RUNS,
        "generate": {
            "prefill_ms": gs["prefill_ms"], "tokens_per_second": gs["tokens_per_second"],
            "load_ms": gs["load_ms"], "generated_tokens": gs["generated_tokens"],
            "gpu_memory_peak_mib": gen_mem,
        },
        "serve": {
            "load_to_healthy_s": load_s, "first_token_ms": ttft, "stream_tokens_per_second": tps,
            "gpu_memory_idle_mib": idle, "gpu_memory_peak_mib": busy_peak,
            "tokens_match_generate": all(r["tokens_match_generate"] for r in runs), "per_run": runs,
        },
        "ratio_tokens_per_second": tps / gs["tokens_per_second"] if tps and gs["tokens_per_second"] else None,
        "first_token_minus_prefill_ms": ttft - gs["prefill_ms"] if ttft is not None else None,
        "gpu_memory_serve_idle_minus_generate_peak_mib": idle - gen_mem,
        "max_batch": MAX_BATCH,
        "load": load,
    }
    with open(os.path.join(OUT, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
