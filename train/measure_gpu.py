"""Speculative vs plain decoding of the demo coder on a GPU, measured with dspark itself.

Runs `dspark generate --device cuda --json` on the 12 held-out prompts (128 new tokens),
with and without the DSpark draft, best of 3 runs each, checks the outputs are identical, and
prints one table plus JSON lines. Usage (on the GPU machine, release binary carried in
.gpu-bundle/): python3 train/measure_gpu.py .gpu-bundle/dspark
"""
import json
import subprocess
import sys

exe = sys.argv[1] if len(sys.argv) > 1 else "target/release/dspark"
prompts = json.load(open("train/heldout_prompts.json"))


def run(prompt, draft):
    cmd = [exe, "generate", "--target", "fixtures/coder-target", "--prompt", prompt, "--max-tokens", "128",
           "--device", "cuda", "--json"]
    if draft:
        cmd += ["--draft", "fixtures/coder-draft"]
    best = None
    for _ in range(3):
        out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        if best is None or out["stats"]["decode_ms"] < best["stats"]["decode_ms"]:
            best = out
    return best


rows = []
plain_ms = spec_ms = 0.0
for i, p in enumerate(prompts):
    a, b = run(p, False), run(p, True)
    assert a["tokens"] == b["tokens"], f"prompt {i}: speculative output differs from plain greedy"
    s = b["stats"]["speculative"]
    rows.append({"prompt": i, "tokens": len(a["tokens"]), "tau": s["mean_accepted_length"],
                 "plain_tok_s": a["stats"]["tokens_per_second"], "spec_tok_s": b["stats"]["tokens_per_second"]})
    plain_ms += a["stats"]["decode_ms"]
    spec_ms += b["stats"]["decode_ms"]
for r in rows:
    print(json.dumps(r))
print(f"| prompt | tau | plain tok/s | DSpark tok/s | speed-up |")
for r in rows:
    print(f"| {r['prompt']} | {r['tau']:.2f} | {r['plain_tok_s']:.0f} | {r['spec_tok_s']:.0f} | {r['spec_tok_s'] / r['plain_tok_s']:.2f}x |")
print(f"overall decode-time speed-up: {plain_ms / spec_ms:.2f}x (plain {plain_ms:.0f} ms, DSpark {spec_ms:.0f} ms)")
