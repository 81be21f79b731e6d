#!/usr/bin/env python3
"""Train the embedded demo: a tiny Qwen3 "coder" target and its DSpark draft (project issue 6).

One process, one GPU, under 4 minutes on an H200 with the defaults (see train/README.md for the
exact `run` command). Stages, in order:

1. corpus     every `*.py` file of this interpreter's stdlib (sysconfig "stdlib" path, sorted,
              site-/dist-packages excluded, non-UTF-8 and empty files skipped); 5 % of files held
              out for evaluation, chosen by sha256(relative path) mod 20 == 0.
2. tokenizer  byte-level BPE (HF tokenizers), 4096 entries including the specials
              <|endoftext|>=0 <|im_start|>=1 <|im_end|>=2 <|mask|>=3; trained on the training
              files only.
3. target     Qwen3ForCausalLM (hidden 256, 4 layers, 4 heads / 2 kv heads, head_dim 64,
              intermediate 704, tied embeddings, vocab 4096), next-token CE on 1024-token windows
              of the training stream (files joined by <|endoftext|>), AdamW + cosine, bf16
              autocast; held-out loss evaluated periodically, the best checkpoint is kept and
              training stops early when it stops improving. Saved in bf16, HF layout.
4. regenerate continuations of the frozen target from training-file prompts: a sampled
              (T=1) prefix of 0-128 tokens, then greedy (DeepSpec trains its drafts on
              target-regenerated data; a draft serving greedy decoding should learn the
              target's greedy outputs, and the sampled prefix moves the target off text it has
              memorised). Pure-greedy continuations of held-out files give the eval set.
5. draft      nemo-automodel 0.7.0 `Qwen3DSparkModel` (DeepSpec's architecture: anchor-first
              block of 7, context = fc + hidden_norm of the outputs of target layers [1, 2],
              bidirectional in-block attention, vanilla Markov head rank 64, confidence head with
              Markov input), trained against the frozen target with nemo's own training forward
              (random anchors, teacher-forced Markov previous tokens) and the DSpark objective
              0.1 CE + 0.9 L1(p_draft, p_target) + 1.0 BCE(confidence, 1 - L1/2), gamma-decay 4
              position weights (same formulas as nemo's compute_dspark_loss, computed unchunked).
              Batches mix corpus windows (1/4) and regenerated sequences (3/4). Saved in DeepSpec's native
              format (config.json + model.safetensors, bf16) without embed_tokens / lm_head (the
              engine borrows the target's).

Outputs under --out: coder-target.tar (coder-target/{config.json, generation_config.json,
model.safetensors, tokenizer.json}), coder-draft.tar (coder-draft/{config.json,
model.safetensors}), meta.tar (corpus manifest, held-out prompts, metrics) and metrics.json.

Training length: the target runs a fixed --target-steps schedule (700; 0 = time it against
--target-budget instead); the draft times its first steps and then fixes its total step count to
fit --draft-budget (printed and written to metrics.json; pass --draft-steps to repeat a run with
exactly that count). Both keep the best evaluated checkpoint and stop early after --patience /
--draft-patience evaluations without improvement. Seeds are fixed; GPU kernels are not
bit-deterministic, so a rerun gives close but not byte-identical weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

import numpy as np
import safetensors.torch
import tokenizers
import torch
import torch.nn.functional as F
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

# Fail fast (before minutes of training) if nemo-automodel is missing.
from nemo_automodel.components.speculative.dspark.common import build_anchor_candidate_mask
from nemo_automodel.components.speculative.dspark.config import build_draft_config
from nemo_automodel.components.speculative.dspark.draft_qwen3 import Qwen3DSparkModel

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
EOT, IM_START, IM_END, MASK = 0, 1, 2, 3
EOS_IDS = [IM_END, EOT]
VOCAB = 4096
HELDOUT_MOD = 20  # sha256(path) % 20 == 0  ->  ~5 % of files held out

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:7.1f}s]", *a, flush=True)


class Args(dict):
    """nemo's build_draft_config wants attribute access and `in`."""

    __getattr__ = dict.__getitem__


# ------------------------------------------------------------------------------------------
# 1. corpus
# ------------------------------------------------------------------------------------------


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16) % HELDOUT_MOD == 0


def load_corpus(root: Path, max_files: int | None):
    rels = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if p.is_file() and not ({"site-packages", "dist-packages"} & set(p.relative_to(root).parts))
    )
    if max_files:
        rels = rels[:max_files]
    files, skipped = [], []
    for rel in rels:
        b = (root / rel).read_bytes()
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append((rel, "non-utf8"))
            continue
        if not text.strip():
            skipped.append((rel, "empty"))
            continue
        files.append(
            dict(path=rel, bytes=len(b), sha256=hashlib.sha256(b).hexdigest(), heldout=is_heldout(rel), text=text)
        )
    return files, skipped


def corpus_manifest(files, skipped, root: Path):
    lines = "".join(f"{f['sha256']}  {f['path']}\n" for f in files)
    return dict(
        python=sys.version.split()[0],
        stdlib=str(root),
        rule="all *.py under the stdlib dir, sorted by relative path; site-/dist-packages excluded; "
        "non-UTF-8 and empty files skipped; held out iff int(sha256(relpath)[:8], 16) % 20 == 0",
        num_files=len(files),
        num_train_files=sum(not f["heldout"] for f in files),
        num_heldout_files=sum(f["heldout"] for f in files),
        train_bytes=sum(f["bytes"] for f in files if not f["heldout"]),
        heldout_bytes=sum(f["bytes"] for f in files if f["heldout"]),
        corpus_sha256=hashlib.sha256(lines.encode()).hexdigest(),
        corpus_sha256_rule="sha256 of the sha256sum-style listing (corpus_files.sha256)",
        heldout_files=[f["path"] for f in files if f["heldout"]],
        skipped=[dict(path=p, why=w) for p, w in skipped],
    ), lines


# ------------------------------------------------------------------------------------------
# 2. tokenizer
# ------------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size(with_added_tokens=True) == VOCAB, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    probe = "<|im_start|>user\ndef f(x):\n    return x<|im_end|><|endoftext|>"
    assert tok.decode(tok.encode(probe).ids, skip_special_tokens=False) == probe
    return tok


def tokenize_stream(tok: Tokenizer, texts: list[str]):
    """Concatenate files as [ids..., <|endoftext|>]; returns (stream, doc start offsets)."""
    encs = tok.encode_batch(texts)
    parts, starts, off = [], [], 0
    for e in encs:
        ids = e.ids + [EOT]
        starts.append(off)
        parts.append(np.asarray(ids, dtype=np.int64))
        off += len(ids)
    return np.concatenate(parts), np.asarray(starts, dtype=np.int64)


# ------------------------------------------------------------------------------------------
# shared training helpers
# ------------------------------------------------------------------------------------------


def lr_at(step, total, warmup, peak, min_frac):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def make_optimizer(params_named, lr, wd, device):
    decay = [p for n, p in params_named if p.requires_grad and p.ndim >= 2]
    no_decay = [p for n, p in params_named if p.requires_grad and p.ndim < 2]
    kw = dict(lr=lr, betas=(0.9, 0.95), eps=1e-8)
    if device.type == "cuda":
        kw["fused"] = True
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}], **kw)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def budgeted_training(name, *, step_fn, eval_fn, better, budget_s, fixed_steps, warmup, peak_lr, min_lr_frac,
                      num_evals, patience, device, snapshot, min_steps=30):
    """Runs step_fn(step, lr) -> loss (float) for a step count fixed either by --*-steps or by
    timing the first steps against budget_s; evaluates num_evals times (plus at the end) and
    keeps the best snapshot; stops early after `patience` evals without improvement."""
    t_start = time.time()
    total = fixed_steps
    calib_from, calib_to = 3, 23
    history, best, best_step, bad = [], None, -1, 0
    ema = None
    step = 0
    eval_every = max(1, (total or 10**9) // num_evals)
    t_calib0 = None
    while total is None or step < total:
        lr = lr_at(step, total or 10**9, warmup, peak_lr, min_lr_frac)
        loss = step_fn(step, lr)
        ema = loss if ema is None else 0.98 * ema + 0.02 * loss
        step += 1
        if total is None and step == calib_from:
            sync(device)
            t_calib0 = time.time()
        if total is None and step == calib_to:
            sync(device)
            per_step = (time.time() - t_calib0) / (calib_to - calib_from)
            te = time.time()
            m = eval_fn()
            eval_s = time.time() - te
            history.append(dict(step=step, train_loss_ema=ema, **m))
            left = budget_s - (time.time() - t_start)
            total = max(min_steps, step + int((left - num_evals * eval_s) / per_step))
            eval_every = max(1, total // num_evals)
            log(f"{name}: {per_step * 1e3:.1f} ms/step, eval {eval_s:.1f}s -> total steps {total} "
                f"(eval every {eval_every})")
        if step % 50 == 0:
            log(f"{name} step {step}/{total}: loss {loss:.4f} (ema {ema:.4f}) lr {lr:.2e}")
        if total is not None and (step % eval_every == 0 or step == total):
            m = eval_fn()
            history.append(dict(step=step, train_loss_ema=ema, **m))
            score = m["score"]
            if best is None or better(score, best):
                best, best_step, bad = score, step, 0
                snapshot(step)
            else:
                bad += 1
            log(f"{name} eval @ {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in m.items() if isinstance(v, float)))
            if bad >= patience:
                log(f"{name}: no improvement for {patience} evals, stopping at step {step}")
                break
    sync(device)
    return dict(steps_run=step, total_steps=total, best_step=best_step, best_score=best, history=history,
                wall_s=time.time() - t_start)


# ------------------------------------------------------------------------------------------
# 3. target
# ------------------------------------------------------------------------------------------


def target_config(max_pos: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=max_pos,
        initializer_range=0.02,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        attention_bias=False,
        attention_dropout=0.0,
        use_sliding_window=False,
        tie_word_embeddings=True,
        bos_token_id=EOT,
        eos_token_id=IM_END,
        pad_token_id=None,  # a pad id would make nn.Embedding zero and freeze that row
    )


def window_starts(gen, n, stream_len, ok_doc_starts, seq):
    """Half the windows start at a file start (ok_doc_starts: those with room for a whole
    window), half anywhere, so position 0 = file start is in-distribution for prompts taken
    from file beginnings."""
    n_doc = n // 2
    ok = ok_doc_starts
    a = ok[torch.randint(0, len(ok), (n_doc,), generator=gen, device=ok.device)]
    b = torch.randint(0, stream_len - seq - 1, (n - n_doc,), generator=gen, device=ok.device)
    return torch.cat([a, b])


def gather_windows(stream, starts, seq):
    idx = starts[:, None] + torch.arange(seq + 1, device=stream.device)[None, :]
    return stream[idx]


def lm_loss(model, ids, amp):
    with amp():
        h = model.model(input_ids=ids[:, :-1]).last_hidden_state
        logits = model.lm_head(h)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


@torch.no_grad()
def heldout_loss(model, windows, amp, bs):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(windows), bs):
        w = windows[i : i + bs]
        tot += float(lm_loss(model, w, amp)) * w[:, 1:].numel()
        n += w[:, 1:].numel()
    model.train()
    return tot / n


def fixed_windows(stream, seq, max_windows):
    n = min(max_windows, (len(stream) - 1) // seq)
    starts = torch.arange(n, device=stream.device) * seq
    return gather_windows(stream, starts, seq)


# ------------------------------------------------------------------------------------------
# 4. target-greedy regeneration
# ------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_batch(model, prompts, n_new, amp, n_sampled=None, gen=None):
    """Batched continuation with a KV cache; prompts [B, Lp] (no padding). Row b samples its
    first n_sampled[b] new tokens at temperature 1 and continues greedily; n_sampled=None is
    pure greedy. Sampled prefixes move the target off text it has memorised, so the greedy
    part looks like its greedy decoding of unseen code (what the draft meets at serving)."""

    def pick(logits, t):
        g = logits.argmax(-1)
        if n_sampled is None:
            return g
        s = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen).squeeze(1)
        return torch.where(t < n_sampled, s, g)

    with amp():
        out = model(input_ids=prompts, use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    nxt = pick(out.logits[:, -1], 0)
    toks = [nxt]
    for t in range(1, n_new):
        with amp():
            out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = pick(out.logits[:, -1], t)
        toks.append(nxt)
    return torch.cat([prompts, torch.stack(toks, 1)], 1)


def gen_loss_mask(seqs, lp, train_prompt):
    """1 up to and including the first EOS after the prompt, 0 after. For eval sets the prompt
    is masked too (anchors then sit on target-generated tokens only, as in real decoding)."""
    B, L = seqs.shape
    pos = torch.arange(L, device=seqs.device)[None, :]
    is_eos = (seqs == EOT) | (seqs == IM_END)
    is_eos = is_eos & (pos >= lp)
    first = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((B,), L, device=seqs.device))
    m = pos <= first[:, None]
    if not train_prompt:
        m = m & (pos >= lp)
    return m.to(torch.float32)


# ------------------------------------------------------------------------------------------
# 5. draft
# ------------------------------------------------------------------------------------------


def dspark_loss(out, gamma, ce_a, l1_a, conf_a):
    """nemo's compute_dspark_loss (single process), without its 128-row checkpointed chunking:
    gamma-decay weights exp(-k/gamma) on valid slots; CE to the data token; L1 between draft and
    target probabilities; confidence BCE to the analytic acceptance 1 - L1/2 (detached)."""
    B, N, K, V = out.draft_logits.shape
    w = out.eval_mask.float() * torch.exp(-torch.arange(K, device=w_dev(out)).float() / gamma).view(1, 1, K)
    sel = out.eval_mask
    wd = w[sel]
    den = wd.sum() + 1e-6
    dl = out.draft_logits[sel].float()
    tl = out.aligned_target_logits[sel].detach().float()
    ce = F.cross_entropy(dl, out.target_ids[sel], reduction="none")
    l1 = (torch.softmax(dl, -1) - torch.softmax(tl, -1)).abs().sum(-1)
    acc = (1.0 - 0.5 * l1).clamp(0.0, 1.0).detach()
    terms = dict(ce=(ce * wd).sum() / den, l1=(l1 * wd).sum() / den)
    loss = ce_a * terms["ce"] + l1_a * terms["l1"]
    if out.confidence_pred is not None:
        bce = F.binary_cross_entropy_with_logits(out.confidence_pred[sel].float(), acc, reduction="none")
        terms["conf"] = (bce * wd).sum() / den
        loss = loss + conf_a * terms["conf"]
    return loss, terms


def w_dev(out):
    return out.draft_logits.device


def draft_args(markov_rank, num_anchors):
    return Args(
        num_draft_layers=2,
        target_layer_ids=[1, 2],
        block_size=7,
        mask_token_id=MASK,
        num_anchors=num_anchors,
        confidence_head_alpha=1.0,
        confidence_head_with_markov=True,
        markov_rank=markov_rank,
        markov_head_type="vanilla",
    )


@torch.no_grad()
def target_features(target, ids, taps, amp):
    """Tapped layer outputs (HF hidden_states[l + 1], residual stream before the final norm)
    concatenated in tap order, and the post-norm last hidden (for the target's logits)."""
    with amp():
        o = target.model(input_ids=ids, output_hidden_states=True)
    hs = o.hidden_states
    assert len(hs) == target.config.num_hidden_layers + 1
    assert max(taps) < target.config.num_hidden_layers - 1
    return torch.cat([hs[l + 1] for l in taps], -1), o.last_hidden_state


class NoMarkov:
    """Context manager: the draft's Markov head contributes no bias (ablation eval)."""

    def __init__(self, draft):
        self.h = draft.markov_head

    def __enter__(self):
        self.h.apply_block_logits = lambda base_logits, **kw: base_logits

    def __exit__(self, *a):
        del self.h.apply_block_logits


@torch.no_grad()
def draft_eval(draft, target, seqs, masks, amp, bs, taps, ablation=False, sim_tokens=128):
    """Teacher-forced acceptance on target-greedy sequences: for every anchor on a generated
    token, the number of leading slots whose greedy (Markov-corrected) draft token equals the
    target's greedy token. With teacher forcing the Markov previous token equals the draft's
    own previous choice whenever the prefix matched, so 1 + that count is the accepted length
    the engine would get for a round anchored there (up to numerics).
    tf_accept_len averages that over every anchor position, which over-weights easy stretches
    (the serving loop crosses them in few rounds); sim_accept_len walks the rounds the serving
    loop would make over the first sim_tokens generated tokens and reports emitted tokens per
    round, i.e. the engine's mean accepted length. It is the model-selection score."""
    draft.eval()
    saved = draft.num_anchors
    draft.num_anchors = seqs.shape[1]  # every valid position becomes an anchor
    res = {}
    for tag, ctx in (("", None), ("_nomarkov", NoMarkov(draft)))[: 2 if ablation else 1]:
        acc_len, blocks, ar_num, ar_den, l1_num, cabs, tau_exp = 0.0, 0, 0.0, 0.0, 0.0, 0.0, 0.0
        sim_rounds, sim_emitted = 0, 0
        if ctx:
            ctx.__enter__()
        try:
            for i in range(0, len(seqs), bs):
                ids, lm = seqs[i : i + bs], masks[i : i + bs]
                feats, last = target_features(target, ids, taps, amp)
                with amp():
                    out = draft(input_ids=ids, target_hidden_states=feats, loss_mask=lm, target_last_hidden_states=last)
                em = out.eval_mask
                valid_block = out.block_keep_mask & em[..., 0]
                match = (out.draft_logits.argmax(-1) == out.target_ids) & em
                pref = match.int().cumprod(-1).sum(-1).float()
                acc_len += float((pref + 1)[valid_block].sum())
                blocks += int(valid_block.sum())
                # Walk rounds as the serving loop does: first anchor = first generated token,
                # next anchor = anchor + accepted + 1, for up to sim_tokens emitted tokens.
                cand = build_anchor_candidate_mask(seq_len=ids.shape[1], loss_mask=lm).cpu()
                pref_c, keep_c = pref.cpu(), valid_block.cpu()
                for r in range(ids.shape[0]):
                    pos = torch.nonzero(cand[r]).flatten().tolist()
                    table = {p_: int(pref_c[r, j]) for j, p_ in enumerate(pos) if keep_c[r, j]}
                    if not pos:
                        continue
                    p_ = start = pos[0]
                    while p_ in table and p_ - start < sim_tokens:
                        m_ = table[p_]
                        sim_rounds += 1
                        sim_emitted += m_ + 1
                        p_ += m_ + 1
                p = torch.softmax(out.draft_logits.float(), -1)
                q = torch.softmax(out.aligned_target_logits.float(), -1)
                a = (1 - 0.5 * (p - q).abs().sum(-1)).clamp(0, 1)
                ar_num += float((a * em).sum())
                ar_den += float(em.sum())
                tau_exp += float(((a * em).cumprod(-1).sum(-1) + 1)[valid_block].sum())
                if out.confidence_pred is not None and not ctx:
                    cabs += float(((torch.sigmoid(out.confidence_pred.float()) - a).abs() * em).sum())
        finally:
            if ctx:
                ctx.__exit__()
        res[f"sim_accept_len{tag}"] = sim_emitted / max(1, sim_rounds)
        res[f"tf_accept_len{tag}"] = acc_len / max(1, blocks)
        res[f"expected_tau{tag}"] = tau_exp / max(1, blocks)
        res[f"accept_rate{tag}"] = ar_num / max(1.0, ar_den)
        if not ctx:
            res["confidence_mae"] = cabs / max(1.0, ar_den)
            res["eval_blocks"] = float(blocks)
    draft.num_anchors = saved
    draft.train()
    res["score"] = res["sim_accept_len"]
    return res


def save_draft(draft, out_dir: Path):
    """DeepSpec native format, bf16, without embed_tokens / lm_head."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = draft.config
    cfg.save_pretrained(out_dir)  # writes config.json only
    j = json.loads((out_dir / "config.json").read_text())
    j["dtype"] = "bfloat16"
    j.pop("_attn_implementation", None)
    j.pop("_attn_implementation_autoset", None)
    (out_dir / "config.json").write_text(json.dumps(j, indent=2, sort_keys=True) + "\n")
    sd = {
        k: v.detach().to(torch.bfloat16).contiguous().cpu()
        for k, v in draft.state_dict().items()
        if k not in ("embed_tokens.weight", "lm_head.weight") and "rotary_emb" not in k
    }
    safetensors.torch.save_file(sd, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return sorted(sd)


def load_saved_draft(path: Path, target, device):
    """Load the saved draft the way an engine would: config + weights from disk, embed/lm_head
    borrowed from the target."""
    cfg = Qwen3Config.from_pretrained(path)
    d = Qwen3DSparkModel(cfg)
    sd = safetensors.torch.load_file(str(path / "model.safetensors"))
    sd["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().float().cpu()
    sd["lm_head.weight"] = target.get_output_embeddings().weight.detach().float().cpu()
    missing, unexpected = d.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    assert not unexpected and all("rotary_emb" in m for m in missing), (missing, unexpected)
    d.config._attn_implementation = draft_attn_impl
    return d.to(device)


draft_attn_impl = "sdpa"


# ------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------


def tar_dir(tar_path: Path, src_dirs: list[Path]):
    with tarfile.open(tar_path, "w") as t:
        for d in src_dirs:
            for f in sorted(d.iterdir()):
                t.add(f, arcname=f"{d.name}/{f.name}")


def main():
    global draft_attn_impl
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=None, help="scratch dir (default: OUT/../dspark-train-work)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--max-files", type=int, default=None, help="debug: use only the first N files")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--total-budget", type=float, default=300.0, help="seconds for the whole script")
    ap.add_argument("--target-budget", type=float, default=200.0, help="used only without --target-steps")
    ap.add_argument("--draft-budget", type=float, default=120.0)
    ap.add_argument("--target-steps", type=int, default=700, help="0: set by --target-budget")
    ap.add_argument("--draft-steps", type=int, default=None)
    ap.add_argument("--target-seq", type=int, default=1024)
    ap.add_argument("--target-batch", type=int, default=64)
    ap.add_argument("--target-lr", type=float, default=3e-3)
    ap.add_argument("--max-pos", type=int, default=2048)
    ap.add_argument("--gen-seqs", type=int, default=4096)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--gen-eval-seqs", type=int, default=256)
    ap.add_argument("--draft-seq", type=int, default=512)
    ap.add_argument("--draft-batch", type=int, default=128)
    ap.add_argument("--num-anchors", type=int, default=64)
    ap.add_argument("--draft-lr", type=float, default=2e-3)
    ap.add_argument("--markov-rank", type=int, default=64)
    ap.add_argument("--eval-bs", type=int, default=32)
    ap.add_argument("--num-evals", type=int, default=20)
    ap.add_argument("--patience", type=int, default=4)
    ap.add_argument("--draft-num-evals", type=int, default=8)
    ap.add_argument("--draft-patience", type=int, default=3)
    ap.add_argument("--corpus-frac", type=float, default=0.25, help="share of corpus windows in a draft batch")
    ap.add_argument("--sampled-prefixes", type=int, nargs="*", default=[0, 0, 16, 48, 128],
                    help="draft regeneration: each sequence samples its first n new tokens (n drawn from this list) at T=1, then greedy")
    ap.add_argument("--num-prompts", type=int, default=12)
    args = ap.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        log("gpu:", torch.cuda.get_device_name(0))
    else:
        torch.set_num_threads(max(1, os.cpu_count() or 1))

    def amp():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    work = args.work or out.parent / "dspark-train-work"
    work.mkdir(parents=True, exist_ok=True)
    metrics = dict(
        versions=dict(python=sys.version.split()[0], torch=torch.__version__, transformers=transformers.__version__,
                      tokenizers=tokenizers.__version__, safetensors=safetensors.__version__, numpy=np.__version__),
        args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    )
    if device.type == "cuda":
        metrics["versions"]["gpu"] = torch.cuda.get_device_name(0)

    def dump_metrics():
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")

    # ---- 1. corpus ---------------------------------------------------------------------------
    files, skipped = load_corpus(args.stdlib, args.max_files)
    manifest, sha_lines = corpus_manifest(files, skipped, args.stdlib)
    meta_dir = work / "meta"
    meta_dir.mkdir(exist_ok=True)
    (meta_dir / "corpus_manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    (meta_dir / "corpus_files.sha256").write_text(sha_lines)
    metrics["corpus"] = {k: v for k, v in manifest.items() if k not in ("heldout_files", "skipped")}
    metrics["corpus"]["num_skipped"] = len(skipped)
    log(f"corpus: {manifest['num_files']} files ({manifest['num_train_files']} train / "
        f"{manifest['num_heldout_files']} held out), {manifest['train_bytes']} + {manifest['heldout_bytes']} bytes, "
        f"sha256 {manifest['corpus_sha256'][:16]}…, skipped {len(skipped)}")
    train_texts = [f["text"] for f in files if not f["heldout"]]
    held_files = [f for f in files if f["heldout"]]

    # Held-out prompts: the first ~200 characters (cut after the last newline in the first 200
    # characters when that keeps >= 120) of up to --num-prompts held-out files >= 2 kB, evenly
    # spaced over the sorted held-out list.
    big = [f for f in held_files if f["bytes"] >= 2000]
    pick = [big[round(i * (len(big) - 1) / max(1, args.num_prompts - 1))] for i in range(min(args.num_prompts, len(big)))]
    prompts = []
    for f in pick:
        head = f["text"][:200]
        cut = head.rfind("\n")
        prompts.append(dict(path=f["path"], prompt=head[: cut + 1] if cut + 1 >= 120 else head))
    (meta_dir / "heldout_prompts.json").write_text(json.dumps(prompts, indent=2) + "\n")

    # ---- 2. tokenizer ------------------------------------------------------------------------
    tok = train_tokenizer(train_texts)
    tok_path = work / "tokenizer.json"
    tok.save(str(tok_path))
    tok = Tokenizer.from_file(str(tok_path))
    train_np, train_docs_np = tokenize_stream(tok, train_texts)
    held_np, held_docs_np = tokenize_stream(tok, [f["text"] for f in held_files])
    metrics["tokenizer"] = dict(vocab=tok.get_vocab_size(True), specials={s: i for i, s in enumerate(SPECIALS)},
                                sha256=hashlib.sha256(tok_path.read_bytes()).hexdigest(),
                                train_tokens=int(len(train_np)), heldout_tokens=int(len(held_np)),
                                train_bytes_per_token=manifest["train_bytes"] / len(train_np))
    log(f"tokenizer: {len(train_np)} train tokens, {len(held_np)} held-out tokens "
        f"({metrics['tokenizer']['train_bytes_per_token']:.2f} bytes/token)")
    dump_metrics()
    train_stream = torch.from_numpy(train_np).to(device)
    train_docs = torch.from_numpy(train_docs_np).to(device)
    held_stream = torch.from_numpy(held_np).to(device)
    held_docs = torch.from_numpy(held_docs_np).to(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(args.seed)

    # ---- 3. target ---------------------------------------------------------------------------
    torch.manual_seed(args.seed + 1)
    tcfg = target_config(args.max_pos)
    target = Qwen3ForCausalLM(tcfg).to(device)
    target.config._attn_implementation = "sdpa"
    target.train()
    n_params = sum(p.numel() for p in target.parameters())
    log(f"target: {n_params} params")
    opt = make_optimizer(list(target.named_parameters()), args.target_lr, 0.1, device)
    held_windows = fixed_windows(held_stream, args.target_seq, 256)
    t_ok_docs = train_docs[train_docs + args.target_seq + 1 <= len(train_stream)]
    best_target = {}

    def t_step(step, lr):
        for g in opt.param_groups:
            g["lr"] = lr
        starts = window_starts(gen, args.target_batch, len(train_stream), t_ok_docs, args.target_seq)
        ids = gather_windows(train_stream, starts, args.target_seq)
        loss = lm_loss(target, ids, amp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(target.parameters(), 1.0)
        opt.step()
        return float(loss.detach())

    def t_eval_scored():
        hl = heldout_loss(target, held_windows, amp, 32)
        return dict(heldout_loss=hl, score=hl)

    def t_snapshot(step):
        best_target["step"] = step
        best_target["sd"] = {k: v.detach().clone() for k, v in target.state_dict().items()}

    elapsed = time.time() - T0
    t_budget = min(args.target_budget, max(30.0, (args.total_budget - elapsed - 100.0) / 2))
    log(f"target: budget {t_budget:.0f}s")
    tr = budgeted_training("target", step_fn=t_step, eval_fn=t_eval_scored, better=lambda a, b: a < b - 1e-4,
                           budget_s=t_budget, fixed_steps=args.target_steps or None, warmup=100, peak_lr=args.target_lr,
                           min_lr_frac=0.1, num_evals=args.num_evals, patience=args.patience, device=device,
                           snapshot=t_snapshot)
    target.load_state_dict(best_target["sd"])
    del opt, best_target["sd"]
    target = target.to(torch.bfloat16).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    bf16_loss = heldout_loss(target, held_windows, amp, 32)
    target.eval()
    tr["heldout_loss_bf16_saved"] = bf16_loss
    tr["params"] = n_params
    tr["tokens_per_step"] = args.target_batch * args.target_seq
    metrics["target"] = tr
    log(f"target: best step {tr['best_step']} held-out loss {tr['best_score']:.4f} (bf16 weights {bf16_loss:.4f}), "
        f"{tr['steps_run']} steps in {tr['wall_s']:.0f}s")
    tdir = work / "coder-target"
    target.generation_config = GenerationConfig(bos_token_id=EOT, eos_token_id=list(EOS_IDS))
    target.save_pretrained(tdir)
    (tdir / "tokenizer.json").write_bytes(tok_path.read_bytes())
    cj = json.loads((tdir / "config.json").read_text())
    assert cj.get("dtype") == "bfloat16" and cj["tie_word_embeddings"] is True, cj
    on_disk = safetensors.torch.load_file(str(tdir / "model.safetensors"))
    assert "lm_head.weight" not in on_disk and all(v.dtype == torch.bfloat16 for v in on_disk.values())
    tar_dir(out / "coder-target.tar", [tdir])
    dump_metrics()

    # ---- 4. regeneration ---------------------------------------------------------------------
    L = args.draft_seq
    lps = [lp for lp in (16, 32, 64, 128) if lp <= L // 2]

    def regen(stream, docs, n_seqs, bs, tag, lps, sampled):
        seqs, masks = [], []
        ok = docs[docs + 128 <= len(stream)]
        t = time.time()
        for b in range(0, n_seqs, bs):
            nb = min(bs, n_seqs - b)
            lp = lps[(b // bs) % len(lps)]
            st = ok[torch.randint(0, len(ok), (nb,), generator=gen, device=device)]
            pr = gather_windows(stream, st, lp - 1)
            ns = None
            if sampled:
                choices = torch.tensor(sampled, device=device)
                ns = choices[torch.randint(0, len(sampled), (nb,), generator=gen, device=device)]
            s = greedy_batch(target, pr, L - lp, amp, n_sampled=ns, gen=gen)
            seqs.append(s)
            masks.append(gen_loss_mask(s, lp, train_prompt=(tag == "train")))
            if tag == "train" and time.time() - t > 60:
                log("regen: time cap reached")
                break
        seqs, masks = torch.cat(seqs), torch.cat(masks)
        log(f"regen {tag}: {len(seqs)} seqs x {L} in {time.time() - t:.1f}s, "
            f"{float(masks.sum()):.0f} supervised positions, "
            f"{float(((seqs == EOT) | (seqs == IM_END)).any(1).float().mean()):.2f} with EOS")
        return seqs, masks

    sampled = [n for n in args.sampled_prefixes if n < L - max(lps)]
    gen_train, gen_train_mask = regen(train_stream, train_docs, args.gen_seqs, args.gen_batch, "train", lps, sampled)
    eval_lps = [lp for lp in (32, 64) if lp <= L // 2]
    gen_eval, gen_eval_mask = regen(held_stream, held_docs, args.gen_eval_seqs,
                                    max(1, args.gen_eval_seqs // len(eval_lps)), "heldout", eval_lps, None)
    metrics["regen"] = dict(train_seqs=len(gen_train), eval_seqs=len(gen_eval), seq_len=L, train_prompt_lens=lps,
                            train_sampled_prefix_choices=sampled, eval_prompt_lens=eval_lps,
                            eval="pure greedy continuations of held-out file starts")
    dump_metrics()

    # ---- 5. draft ----------------------------------------------------------------------------
    torch.manual_seed(args.seed + 2)
    dcfg = build_draft_config(target.config, draft_args(args.markov_rank, args.num_anchors))
    dcfg._attn_implementation = draft_attn_impl
    draft = Qwen3DSparkModel(dcfg).to(torch.float32).to(device)
    draft.initialize_embeddings_and_head(embed_tokens=target.get_input_embeddings(), lm_head=target.get_output_embeddings())
    draft.train()
    taps = list(dcfg.target_layer_ids)
    d_params = sum(p.numel() for n, p in draft.named_parameters() if n not in ("embed_tokens.weight", "lm_head.weight"))
    log(f"draft: {d_params} params (excluding the borrowed embed_tokens / lm_head)")
    dopt = make_optimizer([(n, p) for n, p in draft.named_parameters() if p.requires_grad], args.draft_lr, 0.01, device)
    half = round(args.draft_batch * args.corpus_frac)
    best_draft = {}
    loss_cfg = dict(gamma=4.0, ce_a=0.1, l1_a=0.9, conf_a=1.0)
    last_terms = {}

    d_ok_docs = train_docs[train_docs + L <= len(train_stream)]

    def d_batch():
        st = window_starts(gen, half, len(train_stream), d_ok_docs, L - 1)
        corp = gather_windows(train_stream, st, L - 1)
        gi = torch.randint(0, len(gen_train), (args.draft_batch - half,), generator=gen, device=device)
        ids = torch.cat([corp, gen_train[gi]])
        lm = torch.cat([torch.ones_like(corp, dtype=torch.float32), gen_train_mask[gi]])
        return ids, lm

    def d_forward(ids, lm):
        feats, last = target_features(target, ids, taps, amp)
        with amp():
            o = draft(input_ids=ids, target_hidden_states=feats, loss_mask=lm, target_last_hidden_states=last)
        return dspark_loss(o, **loss_cfg)

    def d_step(step, lr):
        global draft_attn_impl
        for g in dopt.param_groups:
            g["lr"] = lr
        ids, lm = d_batch()
        try:
            loss, terms = d_forward(ids, lm)
        except RuntimeError as e:  # SDPA refusing the dense float mask: fall back to eager
            if step != 0 or draft_attn_impl == "eager":
                raise
            log(f"draft: sdpa failed ({str(e)[:200]}); using eager attention")
            draft_attn_impl = "eager"
            draft.config._attn_implementation = "eager"
            loss, terms = d_forward(ids, lm)
        dopt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in draft.parameters() if p.requires_grad], 1.0)
        dopt.step()
        last_terms.update({k: float(v.detach()) for k, v in terms.items()})
        return float(loss.detach())

    def d_eval():
        m = draft_eval(draft, target, gen_eval, gen_eval_mask, amp, args.eval_bs, taps)
        m.update({f"train_{k}": v for k, v in last_terms.items()})
        return m

    def d_snapshot(step):
        best_draft["step"] = step
        best_draft["sd"] = {k: v.detach().clone() for k, v in draft.state_dict().items()}

    elapsed = time.time() - T0
    d_budget = min(args.draft_budget, max(30.0, args.total_budget - elapsed - 35.0))
    log(f"draft: budget {d_budget:.0f}s")
    dr = budgeted_training("draft", step_fn=d_step, eval_fn=d_eval, better=lambda a, b: a > b + 1e-4,
                           budget_s=d_budget, fixed_steps=args.draft_steps, warmup=100, peak_lr=args.draft_lr,
                           min_lr_frac=0.1, num_evals=args.draft_num_evals, patience=args.draft_patience,
                           device=device, snapshot=d_snapshot)
    draft.load_state_dict(best_draft["sd"])
    del dopt, best_draft["sd"]
    ddir = work / "coder-draft"
    names = save_draft(draft, ddir)
    # Reload from disk exactly as saved (bf16 weights, borrowed embed/lm_head) and evaluate.
    reloaded = load_saved_draft(ddir, target, device)
    final = draft_eval(reloaded, target, gen_eval, gen_eval_mask, amp, args.eval_bs, taps, ablation=True)
    dr["final_saved_bf16"] = final
    dr["params_excluding_embed_lm_head"] = d_params
    dr["attn_implementation"] = draft_attn_impl
    dr["loss"] = loss_cfg
    dr["tensors"] = names
    metrics["draft"] = dr
    log("draft (saved, bf16): " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    tar_dir(out / "coder-draft.tar", [ddir])

    metrics["sizes_bytes"] = {
        f"{d.name}/{f.name}": f.stat().st_size for d in (tdir, ddir) for f in sorted(d.iterdir())
    }
    metrics["sizes_bytes"]["total"] = sum(metrics["sizes_bytes"].values())
    metrics["wall_s"] = time.time() - T0
    dump_metrics()
    (meta_dir / "metrics.json").write_bytes((out / "metrics.json").read_bytes())
    with tarfile.open(out / "meta.tar", "w") as t:
        for f in sorted(meta_dir.iterdir()):
            t.add(f, arcname=f"meta/{f.name}")
    log(f"done; total model+tokenizer bytes {metrics['sizes_bytes']['total']}")


if __name__ == "__main__":
    main()
