#!/usr/bin/env python3
"""Derive .test-data/coder-draft-nomarkov from fixtures/coder-draft: the same trained weights with
the Markov head and the confidence head removed (markov_rank 0, enable_confidence_head false),
i.e. a DFlash-style draft in the same native format. The confidence head is dropped too because
it was trained on [h ; W1[prev]] and W1 belongs to the Markov head. Comparing the two drafts in
the engine shows what the (tiny) Markov head buys at inference; it is an ablation of the trained
draft, not a separately trained DFlash baseline.

    python3 train/make_nomarkov.py [--src fixtures/coder-draft] [--dst .test-data/coder-draft-nomarkov]

Needs only the `safetensors` and `numpy` packages (e.g. the fixtures venv).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from safetensors import safe_open

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=REPO / "fixtures/coder-draft")
    ap.add_argument("--dst", type=Path, default=REPO / ".test-data/coder-draft-nomarkov")
    a = ap.parse_args()
    cfg = json.loads((a.src / "config.json").read_text())
    cfg["markov_rank"] = 0
    cfg["enable_confidence_head"] = False
    cfg.pop("markov_head_type", None)
    cfg.pop("confidence_head_with_markov", None)
    a.dst.mkdir(parents=True, exist_ok=True)
    (a.dst / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    # bf16 has no numpy dtype: copy the raw bytes through the safetensors header instead.
    import struct

    raw = (a.src / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    data = raw[8 + n :]
    keep = {k: v for k, v in header.items() if not k.startswith(("markov_head.", "confidence_head."))}
    out_header, chunks, off = {}, [], 0
    for k in sorted(keep):
        s, e = keep[k]["data_offsets"]
        buf = data[s:e]
        out_header[k] = dict(dtype=keep[k]["dtype"], shape=keep[k]["shape"], data_offsets=[off, off + len(buf)])
        chunks.append(buf)
        off += len(buf)
    if meta is not None:
        out_header = {"__metadata__": meta, **out_header}
    hb = json.dumps(out_header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    (a.dst / "model.safetensors").write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(chunks))
    dropped = sorted(set(header) - set(keep))
    print(f"{a.dst}: {len(keep)} tensors kept, dropped {dropped}")
    # Sanity: the file parses.
    with safe_open(str(a.dst / "model.safetensors"), "np") as f:
        assert sorted(f.keys()) == sorted(keep)


if __name__ == "__main__":
    main()
