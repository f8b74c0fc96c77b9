#!/usr/bin/env python3
"""Writes a Llama-3-8B-shaped model with random bf16 weights (hidden 4096, 32 layers, 32 heads, 8 KV heads,
intermediate 14336, vocab 128256, llama3 rope) in Hugging Face layout, for benchmarks on the GPU machine, where
16 GB cannot travel. Weights are drawn on the GPU with torch and written as 4 safetensors shards.

    python3 tools/make_llama3_8b_random.py /tmp/llama3-8b-random [--config-only | --sparse]
        [--70b | --qwen3-8b | --gemma3-4b [--full-attention] | --phi3-mini | --qwen3-30b-a3b | --mixtral-8x7b]

--config-only writes config.json alone (enough for `inferd-bench --sections products`); --sparse writes one
model.safetensors whose header lists every tensor and whose data is a sparse file of zeros (instant, no disk
space: for `inferd plan`, which reads shapes only). --70b: the Llama-3-70B shape instead (hidden 8192, 80 layers, 64
heads, 8 KV heads, intermediate 28672): 141 GB in bf16, for tensor parallelism. --qwen3-8b (with --config-only):
the Qwen3-8B shape (hidden 4096, 36 layers, 32 heads, 8 KV heads of 128, intermediate 12288, vocabulary 151,936,
per-head q/k norms), for benchmarks from weights made on the GPU (model.load_format dummy). --gemma3-4b (with
--config-only): Gemma 3 4B's text model (hidden 2560, 34 layers, 8 heads, 4 KV heads of 256, intermediate 10240,
vocabulary 262,208, five 1024-token sliding-window layers to one global), or with --full-attention the same with
every layer global. --phi3-mini (with --config-only): Phi-3.5-mini's shape (hidden 3072, 32 layers, 32 heads and
32 KV heads of 96, intermediate 8192, vocabulary 32,064, LongRoPE from 4,096 of 131,072 positions), whose heads the
cuda backend runs padded to 128. --qwen3-30b-a3b (with --config-only): Qwen3-30B-A3B's shape (hidden 2048, 48
layers, 32 heads and 4 KV heads of 128, every layer a mixture of 128 experts of width 768, 8 a token, renormalised;
vocabulary 151,936). --mixtral-8x7b (with --config-only): Mixtral-8x7B's shape (hidden 4096, 32 layers, 32 heads
and 8 KV heads of 128, every layer a mixture of 8 experts of width 14,336, 2 a token; vocabulary 32,000): 93 GB in
bf16, 47 GB in fp8.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_test_models import LLAMA3_PATTERN, byte_level  # noqa: E402

QWEN3, GEMMA3, PHI3 = "--qwen3-8b" in sys.argv, "--gemma3-4b" in sys.argv, "--phi3-mini" in sys.argv
MOE, MIXTRAL = "--qwen3-30b-a3b" in sys.argv, "--mixtral-8x7b" in sys.argv
H, I, L, NH, NKV, V, D = (8192, 28672, 80, 64, 8, 128256, 128) if "--70b" in sys.argv else \
    (2048, 6144, 48, 32, 4, 151936, 128) if MOE else (4096, 14336, 32, 32, 8, 32000, 128) if MIXTRAL else \
    (4096, 12288, 36, 32, 8, 151936, 128) if QWEN3 else (2560, 10240, 34, 8, 4, 262208, 256) if GEMMA3 else \
    (3072, 8192, 32, 32, 32, 32064, 96) if PHI3 else (4096, 14336, 32, 32, 8, 128256, 128)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tok = byte_level(LLAMA3_PATTERN, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], nfc=False,
                     template_bos="<|begin_of_text|>", vocab_size=640)
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
           "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "bos_token_id": tok.token_to_id("<|begin_of_text|>"),
           "eos_token_id": tok.token_to_id("<|end_of_text|>"),
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}, "rope_theta": 500000.0}
    if QWEN3:
        del cfg["rope_scaling"]
        cfg.update(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=D, rope_theta=1e6,
                   rms_norm_eps=1e-6, max_position_embeddings=40960, attention_bias=False)
    if MOE:
        del cfg["rope_scaling"]
        cfg.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", head_dim=D, rope_theta=1e6,
                   rms_norm_eps=1e-6, max_position_embeddings=40960, attention_bias=False, num_experts=128,
                   num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
                   mlp_only_layers=[])
    if MIXTRAL:
        del cfg["rope_scaling"]
        cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", rope_theta=1e6,
                   max_position_embeddings=32768, num_local_experts=8, num_experts_per_tok=2, sliding_window=None)
    if GEMMA3:
        del cfg["rope_scaling"], cfg["hidden_act"]
        full = "--full-attention" in sys.argv
        cfg.update(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", head_dim=D, rms_norm_eps=1e-6,
                   max_position_embeddings=131072, sliding_window=1024, query_pre_attn_scalar=256,
                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                   layer_types=["full_attention" if full or (l + 1) % 6 == 0 else "sliding_attention"
                                for l in range(L)],
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
        del cfg["rope_theta"]
    if PHI3:
        del cfg["rope_scaling"]
        cfg.update(architectures=["Phi3ForCausalLM"], model_type="phi3", rope_theta=10000.0,
                   max_position_embeddings=131072, original_max_position_embeddings=4096, sliding_window=None,
                   rope_scaling={"type": "longrope", "short_factor": [1.0 + i / 96 for i in range(D // 2)],
                                 "long_factor": [1.0 + i / 2 for i in range(D // 2)]})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if "--config-only" in sys.argv[2:]:
        return
    if "--sparse" in sys.argv[2:]:
        write_sparse(out)
        return
    import torch
    from safetensors.torch import save_file
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}, f)
    gen = torch.Generator(device="cuda").manual_seed(8)

    def rnd(*shape, std):
        return (torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32) * std).to(torch.bfloat16).cpu()

    shards = [{"model.embed_tokens.weight": rnd(V, H, std=1.0)}, {}, {}, {}]
    shards[3]["lm_head.weight"] = rnd(V, H, std=0.02)
    shards[3]["model.norm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    weight_map = {}
    for l in range(L):
        s = shards[l * 4 // L]
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        s[p + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        s[p + "self_attn.q_proj.weight"] = rnd(NH * D, H, std=0.02)
        s[p + "self_attn.k_proj.weight"] = rnd(NKV * D, H, std=0.02)
        s[p + "self_attn.v_proj.weight"] = rnd(NKV * D, H, std=0.02)
        s[p + "self_attn.o_proj.weight"] = rnd(H, NH * D, std=0.02)
        s[p + "mlp.gate_proj.weight"] = rnd(I, H, std=0.02)
        s[p + "mlp.up_proj.weight"] = rnd(I, H, std=0.02)
        s[p + "mlp.down_proj.weight"] = rnd(H, I, std=0.02)
    for i, s in enumerate(shards):
        name = f"model-{i + 1:05d}-of-00004.safetensors"
        save_file(s, os.path.join(out, name), metadata={"format": "pt"})
        weight_map.update({n: name for n in s})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    print(f"wrote {out}: {sum(t.numel() for s in shards for t in s.values()) / 1e9:.2f} B parameters")


def write_sparse(out):
    shapes = {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "model.norm.weight": (H,)}
    for l in range(L):
        p = f"model.layers.{l}."
        shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                       p + "self_attn.q_proj.weight": (NH * D, H), p + "self_attn.k_proj.weight": (NKV * D, H),
                       p + "self_attn.v_proj.weight": (NKV * D, H), p + "self_attn.o_proj.weight": (H, NH * D),
                       p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                       p + "mlp.down_proj.weight": (H, I)})
    header, at = {}, 0
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(8 + len(text) + at)
    print(f"wrote {out}: {at // 2 / 1e9:.2f} B parameters (sparse)")


if __name__ == "__main__":
    main()
