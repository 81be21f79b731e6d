#!/usr/bin/env python3
"""Measure DSpark acceptance and CPU speed-up of the embedded coder demo with dspark itself.

For every prompt in train/heldout_prompts.json (the first ~200 characters of held-out stdlib
files) it runs, on the CPU:

    dspark generate --target fixtures/coder-target                              --prompt P --max-tokens N --json
    dspark generate --target fixtures/coder-target --draft fixtures/coder-draft --prompt P --max-tokens N --json
    (and the same with .test-data/coder-draft-nomarkov when that folder exists)

each --repeats times, checks that speculative output == plain greedy output (lossless), and
prints a table: mean accepted length (stats.speculative.mean_accepted_length, which counts the
bonus/correction token, so 1.0 = nothing accepted, 8.0 = whole block of 7 accepted) and decode
tokens/s (median over repeats) with the speed-up spec/plain. "overall" rows: accepted length
pooled over all rounds (total emitted tokens / total rounds) and the mean over prompts; speed-up
as total decode time of plain / total decode time of speculative.

    cargo build --release -p dspark-cli
    python3 train/measure_acceptance.py [--bin target/release/dspark] [--max-tokens 128] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def gen(bin_: str, target: Path, draft: Path | None, prompt: str, max_tokens: int) -> dict:
    cmd = [bin_, "generate", "--target", str(target), "--prompt", prompt, "--max-tokens", str(max_tokens), "--json",
           "--device", "cpu"]
    if draft is not None:
        cmd[4:4] = ["--draft", str(draft)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd[:6])} ...\n{r.stderr}")
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(REPO / "target/release/dspark"))
    ap.add_argument("--target", type=Path, default=REPO / "fixtures/coder-target")
    ap.add_argument("--drafts", nargs="*", type=Path,
                    default=[REPO / "fixtures/coder-draft", REPO / ".test-data/coder-draft-nomarkov"])
    ap.add_argument("--prompts", type=Path, default=REPO / "train/heldout_prompts.json")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write all numbers here")
    args = ap.parse_args()

    prompts = json.loads(args.prompts.read_text())
    drafts = [d for d in args.drafts if (d / "config.json").exists()]
    rows = []
    for i, prompt in enumerate(prompts):
        plain = [gen(args.bin, args.target, None, prompt, args.max_tokens) for _ in range(args.repeats)]
        row = dict(i=i, prompt=prompt, tokens=len(plain[0]["tokens"]),
                   plain_tps=statistics.median(p["stats"]["tokens_per_second"] for p in plain),
                   plain_decode_ms=statistics.median(p["stats"]["decode_ms"] for p in plain), drafts={})
        for d in drafts:
            runs = [gen(args.bin, args.target, d, prompt, args.max_tokens) for _ in range(args.repeats)]
            for r in runs:
                if r["tokens"] != plain[0]["tokens"]:
                    sys.exit(f"LOSSLESSNESS VIOLATED: prompt {i}, draft {d.name}")
            s = runs[0]["stats"]["speculative"]
            row["drafts"][d.name] = dict(
                mean_accepted_length=s["mean_accepted_length"], rounds=s["rounds"],
                accepted_histogram=s["accepted_histogram"],
                tps=statistics.median(r["stats"]["tokens_per_second"] for r in runs),
                decode_ms=statistics.median(r["stats"]["decode_ms"] for r in runs),
            )
        rows.append(row)

    names = [d.name for d in drafts]
    hdr = f"{'#':>2} {'gen':>4} {'plain tok/s':>11}"
    for n in names:
        hdr += f" | {n + ' τ':>24} {'tok/s':>7} {'speed-up':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        line = f"{r['i']:>2} {r['tokens']:>4} {r['plain_tps']:>11.1f}"
        for n in names:
            d = r["drafts"][n]
            line += f" | {d['mean_accepted_length']:>24.2f} {d['tps']:>7.1f} {d['tps'] / r['plain_tps']:>7.2f}x"
        print(line)
    print("-" * len(hdr))
    summary = {}
    plain_ms = sum(r["plain_decode_ms"] for r in rows)
    for n in names:
        rounds = sum(r["drafts"][n]["rounds"] for r in rows)
        emitted = sum(r["tokens"] for r in rows)
        summary[n] = dict(
            mean_accepted_length_over_prompts=statistics.mean(r["drafts"][n]["mean_accepted_length"] for r in rows),
            pooled_accepted_length=sum(r["drafts"][n]["mean_accepted_length"] * r["drafts"][n]["rounds"] for r in rows) / rounds,
            tokens_per_round=emitted / rounds,
            speedup_total_decode_time=plain_ms / sum(r["drafts"][n]["decode_ms"] for r in rows),
            speedup_mean_of_ratios=statistics.mean(r["drafts"][n]["tps"] / r["plain_tps"] for r in rows),
        )
        s = summary[n]
        print(f"{n}: mean accepted length {s['mean_accepted_length_over_prompts']:.3f} (mean over prompts), "
              f"{s['pooled_accepted_length']:.3f} (pooled over {rounds} rounds); "
              f"CPU decode speed-up {s['speedup_total_decode_time']:.2f}x (total decode time), "
              f"{s['speedup_mean_of_ratios']:.2f}x (mean of per-prompt ratios)")
    print(f"plain greedy: {sum(r['tokens'] for r in rows)} tokens in {plain_ms:.0f} ms decode "
          f"({1e3 * sum(r['tokens'] for r in rows) / plain_ms:.1f} tok/s); lossless: all outputs identical")
    if args.json:
        def rel(v):
            try:
                return str(Path(v).resolve().relative_to(REPO)) if isinstance(v, Path) else v
            except ValueError:
                return str(v)

        shown = {k: [rel(x) for x in v] if isinstance(v, list) else rel(v) for k, v in vars(args).items()}
        args.json.write_text(json.dumps(dict(args=shown, rows=rows,
                                             summary=summary), indent=2) + "\n")


if __name__ == "__main__":
    main()
