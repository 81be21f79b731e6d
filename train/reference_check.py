#!/usr/bin/env python3
"""Cross-check the engine's speculative decoding of the coder demo against the reference.

Runs the reference greedy DSpark loop of fixtures/gen/make_draft_fixtures.py (nemo-automodel
0.7.0 `Qwen3DSparkModel` as the draft oracle, transformers `Qwen3ForCausalLM` as the target,
both f32 on the CPU, full block every round) on the held-out prompts, and `dspark generate
--draft ... --json` on the same prompts, and prints per prompt: the reference's and the
engine's mean accepted length and whether the emitted tokens / per-round accepted counts agree (the engine's last round verifies
only as many drafts as --max-tokens still allows, so its last count may be smaller).
This shows the saved draft runs with nemo's Qwen3DSparkModel semantics and that the engine
implements the same ones.

    .venv-fixtures/bin/python train/reference_check.py [--bin target/release/dspark] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "fixtures/gen"))

import safetensors.torch  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

import make_draft_fixtures as mdf  # noqa: E402
from nemo_automodel.components.speculative.dspark.draft_qwen3 import Qwen3DSparkModel  # noqa: E402


def load_draft(path: Path, target) -> Qwen3DSparkModel:
    d = Qwen3DSparkModel(Qwen3Config.from_pretrained(path)).to(torch.float32)
    sd = {k: v.float() for k, v in safetensors.torch.load_file(str(path / "model.safetensors")).items()}
    sd.setdefault("embed_tokens.weight", target.get_input_embeddings().weight.detach().clone())
    sd.setdefault("lm_head.weight", target.get_output_embeddings().weight.detach().clone())
    d.load_state_dict(sd, strict=True)
    d.config._attn_implementation = "eager"
    return d.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=str(REPO / "target/release/dspark"))
    ap.add_argument("--target", type=Path, default=REPO / "fixtures/coder-target")
    ap.add_argument("--draft", type=Path, default=REPO / "fixtures/coder-draft")
    ap.add_argument("--prompts", type=Path, default=REPO / "train/heldout_prompts.json")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    target = Qwen3ForCausalLM.from_pretrained(a.target, dtype=torch.float32, attn_implementation="eager").eval()
    draft = load_draft(a.draft, target)
    tok = Tokenizer.from_file(str(a.target / "tokenizer.json"))
    prompts = json.loads(a.prompts.read_text())
    print(f"{'#':>2} {'ref τ':>6} {'engine τ':>8} {'same tokens':>11} {'same rounds':>11}")
    ref_all, eng_all, agree = [], [], 0
    for i, p in enumerate(prompts):
        ids = tok.encode(p).ids
        tokens, rounds, _, _ = mdf.speculative_decode(target, draft, ids, a.max_tokens, check_spec=False)
        ref_acc = [r["accepted"] for r in rounds]
        r = subprocess.run([a.bin, "generate", "--target", str(a.target), "--draft", str(a.draft), "--prompt", p,
                            "--max-tokens", str(a.max_tokens), "--json", "--device", "cpu"],
                           capture_output=True, text=True, check=True)
        e = json.loads(r.stdout)
        eng_acc = e["stats"]["speculative"]["accepted_per_round"]
        ref_tau = sum(m + 1 for m in ref_acc) / len(ref_acc)
        eng_tau = e["stats"]["speculative"]["mean_accepted_length"]
        # The engine caps the last round's verify length at the tokens still allowed
        # (--max-tokens); the reference always verifies the whole block and cuts the emission.
        ver = e["stats"]["speculative"]["verified_per_round"]
        same_t = tokens == e["tokens"]
        same_r = len(ref_acc) == len(eng_acc) and ref_acc[:-1] == eng_acc[:-1] and eng_acc[-1] == min(ref_acc[-1], ver[-1])
        agree += same_t and same_r
        ref_all += ref_acc
        eng_all += eng_acc
        print(f"{i:>2} {ref_tau:>6.2f} {eng_tau:>8.2f} {str(same_t):>11} {str(same_r):>11}")
        if a.verbose and not same_r:
            print("   ref", ref_acc, "\n   eng", eng_acc, e["stats"]["speculative"]["verified_per_round"])
    print(f"overall (pooled over rounds): reference {sum(m + 1 for m in ref_all) / len(ref_all):.3f}, "
          f"engine {sum(m + 1 for m in eng_all) / len(eng_all):.3f}; {agree}/{len(prompts)} prompts identical")


if __name__ == "__main__":
    main()
