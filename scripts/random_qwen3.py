"""Writes a random Qwen3-8B checkpoint in the Hugging Face Hub's layout: config.json and
generation_config.json as Qwen ships them, bf16 weights in 5 safetensors shards with
model.safetensors.index.json. Weights are uniform in ±0.02 (norms 1), made on the GPU when
there is one. Used by scripts/ttft.sh on the GPU machine; never by the engine or its tests.
With FP8=1 the decoder projections are written as `Qwen/Qwen3-8B-FP8` ships them: F8_E4M3
weights with BF16 `weight_scale_inv` per 128 × 128 block (amax / 448, the weights quantized with
the bf16-rounded scale) and its `quantization_config`.

usage: [FP8=1] python3 scripts/random_qwen3.py DIR [LAYERS]
"""
import json, os, sys
import torch
from safetensors.torch import save_file

out = sys.argv[1]
fp8 = os.environ.get("FP8") == "1"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 36
h, inter, nh, nkv, hd, vocab = 4096, 12288, 32, 8, 128, 151936
config = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": hd, "hidden_act": "silu",
    "hidden_size": h, "initializer_range": 0.02, "intermediate_size": inter,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": nh, "num_hidden_layers": layers, "num_key_value_heads": nkv,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": vocab,
}
if fp8:
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                     "weight_block_size": [128, 128]}
os.makedirs(out, exist_ok=True)
json.dump(config, open(f"{out}/config.json", "w"), indent=2)
json.dump({"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
           "temperature": 0.6, "top_k": 20, "top_p": 0.95}, open(f"{out}/generation_config.json", "w"), indent=2)
dev = "cuda" if torch.cuda.is_available() else "cpu"
gen = torch.Generator(device=dev).manual_seed(0)

def mat(*shape):
    return ((torch.rand(*shape, device=dev, generator=gen) * 2 - 1) * 0.02).to(torch.bfloat16).cpu()

def proj(name, n, k):
    """A projection: bf16, or with FP8=1 E4M3 bytes and their block scales (both dims % 128 == 0)."""
    w = ((torch.rand(n, k, device=dev, generator=gen) * 2 - 1) * 0.02).to(torch.bfloat16)
    if not fp8:
        return {name: w.cpu()}
    blocks = w.float().reshape(n // 128, 128, k // 128, 128)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448).clamp_min(1e-12).to(torch.bfloat16)
    q = (blocks / scale.float()[:, None, :, None]).clamp(-448, 448).reshape(n, k).to(torch.float8_e4m3fn)
    return {name: q.cpu(), name + "_scale_inv": scale.cpu()}

tensors = {"model.embed_tokens.weight": mat(vocab, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
           "lm_head.weight": mat(vocab, h)}
for l in range(layers):
    p = f"model.layers.{l}."
    tensors.update({
        p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        p + "self_attn.q_norm.weight": torch.ones(hd, dtype=torch.bfloat16),
        p + "self_attn.k_norm.weight": torch.ones(hd, dtype=torch.bfloat16),
    })
    for name, n, k in [("self_attn.q_proj", nh * hd, h), ("self_attn.k_proj", nkv * hd, h),
                       ("self_attn.v_proj", nkv * hd, h), ("self_attn.o_proj", h, nh * hd),
                       ("mlp.gate_proj", inter, h), ("mlp.up_proj", inter, h), ("mlp.down_proj", h, inter)]:
        tensors.update(proj(p + name + ".weight", n, k))
names = list(tensors)
total = sum(t.numel() * t.element_size() for t in tensors.values())
shards, cur, size = [], [], 0
for n in names:
    cur.append(n); size += tensors[n].numel() * tensors[n].element_size()
    if size >= total / 5 and len(shards) < 4:
        shards.append(cur); cur, size = [], 0
if cur:
    shards.append(cur)
weight_map = {}
for i, names_i in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    save_file({n: tensors[n] for n in names_i}, f"{out}/{fname}", metadata={"format": "pt"})
    weight_map.update({n: fname for n in names_i})
json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, open(f"{out}/model.safetensors.index.json", "w"), indent=2)
print(f"wrote {out}: {total / 1e9:.1f} GB in {len(shards)} shards")
