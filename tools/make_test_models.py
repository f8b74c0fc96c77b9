#!/usr/bin/env python3
"""Makes the random-weight test models (Hugging Face layout) and their tokenizers.

    .venv/bin/python tools/make_test_models.py tests/fixtures/models

Deterministic (fixed seeds): running it again rewrites byte-identical files. Tokenizers are trained with
Hugging Face `tokenizers` on text built here, in the styles of the families they stand for:
  byte-level BPE with the Llama 3 split regex (llama3-tiny), byte-level BPE with the Qwen2 regex and NFC
  (qwen2-tiny), SentencePiece-style BPE with Prepend+Replace and byte fallback (llama2-tiny), and with a
  Metaspace pre-tokenizer (mistral-tiny).
"""
import json
import os
import struct
import sys

import numpy as np
from chat_templates import MODEL_TEMPLATES
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers, Regex

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus():
    """Training text: English prose and code in the repository's own words, plus some other scripts."""
    words = ("the model serves requests over a paged cache of blocks while the scheduler batches tokens "
             "every step and the engine samples the next token with temperature top k and top p "
             "inference server kernels attention layers norm rotary embedding weights tensor shape "
             "hello world it's we're they'll I'm don't can't you've she'd").split()
    rng = np.random.default_rng(7)
    lines = []
    for _ in range(3000):
        n = int(rng.integers(4, 16))
        line = " ".join(words[int(i)] for i in rng.integers(0, len(words), n))
        if rng.random() < 0.3:
            line = line.capitalize() + "."
        if rng.random() < 0.2:
            line += f" {int(rng.integers(0, 100000))}"
        lines.append(line)
    code = ["def forward(self, x):\n    return self.norm(x) * 2\n", "for (int i = 0; i < n; ++i) {\n  sum += a[i];\n}\n",
            "    if value is None:\n        raise ValueError('bad value')\n", "x = [1, 2, 3]  # list\n"]
    other = ["日本語のテキストです。東京は日本の首都です。", "中文文本，北京是中国的首都。", "Ünïcödé façade naïve café",
             "Привет, мир! Как дела?", "مرحبا بالعالم", "emoji 😀 🚀 👍🏽 ❤️"]
    return lines + code * 50 + other * 30


def byte_level(pattern, specials, nfc, template_bos, vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=template_bos is not None))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    if template_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{template_bos} $A", pair=f"{template_bos} $A {template_bos} $B",
            special_tokens=[(template_bos, tok.token_to_id(template_bos))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def sentencepiece_like(metaspace, vocab_size):
    """BPE over '▁'-joined words with <unk>, <s>, </s> and 256 byte-fallback tokens, as Llama 2 lays them out."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=["<unk>", "<s>", "</s>"],
                                  limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    spec = json.loads(tok.to_str())
    old = spec["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = 3 + b
    for piece, _ in sorted(old.items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    spec["model"]["vocab"] = vocab
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    return Tokenizer.from_str(json.dumps(spec))


def to_bf16_bits(a):
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16  # round to nearest even
    return rounded.astype(np.uint16)


def save_safetensors(path, tensors, dtype):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name]
        if dtype == "BF16":
            raw = to_bf16_bits(a).tobytes()
        elif dtype == "F16":
            raw = a.astype(np.float16).tobytes()
        else:
            raw = a.astype(np.float32).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def make_weights(cfg, seed, scale=1.0, embed_std=1.0, init_std=None):
    """init_std: every projection, bias and the embedding drawn with this std and the norms at 1, as transformers
    initializes a model of that initializer_range (scale and embed_std then unused)."""
    rng = np.random.default_rng(seed)
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", h // nh)
    w = {}

    def normal(*shape, std, scaled=True):  # `scale` shrinks the layers' projections only
        if init_std is not None:
            return rng.normal(0.0, init_std, size=shape).astype(np.float32)
        return rng.normal(0.0, std * (scale if scaled else 1.0), size=shape).astype(np.float32)

    gemma = cfg["model_type"] in ("gemma3_text", "gemma2")

    def norm_weight(n):  # Gemma stores w of its 1 + w multiplier
        if init_std is not None:
            return np.zeros(n, np.float32) if gemma else np.ones(n, np.float32)
        return (0.0 if gemma else 1.0) + normal(n, std=0.1, scaled=False)

    w["model.embed_tokens.weight"] = normal(v, h, std=embed_std, scaled=False)
    w["model.norm.weight"] = norm_weight(h)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(v, h, std=0.4, scaled=False)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm_weight(h)
        w[p + "post_attention_layernorm.weight"] = norm_weight(h)
        if gemma:  # norms before and after the MLP too
            w[p + "pre_feedforward_layernorm.weight"] = norm_weight(h)
            w[p + "post_feedforward_layernorm.weight"] = norm_weight(h)
        w[p + "self_attn.q_proj.weight"] = normal(nh * hd, h, std=0.25)
        w[p + "self_attn.k_proj.weight"] = normal(nkv * hd, h, std=0.25)
        w[p + "self_attn.v_proj.weight"] = normal(nkv * hd, h, std=0.15)
        w[p + "self_attn.o_proj.weight"] = normal(h, nh * hd, std=0.15)
        if cfg["model_type"] in ("qwen3", "qwen3_moe", "gemma3_text"):  # per-head norms of q and k
            w[p + "self_attn.q_norm.weight"] = norm_weight(hd)
            w[p + "self_attn.k_norm.weight"] = norm_weight(hd)
        if cfg["model_type"] == "qwen2":
            w[p + "self_attn.q_proj.bias"] = normal(nh * hd, std=0.2)
            w[p + "self_attn.k_proj.bias"] = normal(nkv * hd, std=0.2)
            w[p + "self_attn.v_proj.bias"] = normal(nkv * hd, std=0.2)
        experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
        if experts and l not in cfg.get("mlp_only_layers", []) and (l + 1) % cfg.get("decoder_sparse_step", 1) == 0:
            # A mixture of experts in place of the MLP: a router whose logits are spread wide (decisive routing),
            # and each expert's SiLU-gated MLP, under Mixtral's or Qwen3-MoE's names.
            mixtral = cfg["model_type"] == "mixtral"
            ie = cfg.get("moe_intermediate_size", inter)
            w[p + ("block_sparse_moe.gate.weight" if mixtral else "mlp.gate.weight")] = normal(experts, h, std=0.6)
            for e in range(experts):
                q = p + (f"block_sparse_moe.experts.{e}." if mixtral else f"mlp.experts.{e}.")
                names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
                w[q + names[0] + ".weight"] = normal(ie, h, std=0.3)
                w[q + names[1] + ".weight"] = normal(ie, h, std=0.3)
                w[q + names[2] + ".weight"] = normal(h, ie, std=0.3)
            continue
        w[p + "mlp.gate_proj.weight"] = normal(inter, h, std=0.15)
        w[p + "mlp.up_proj.weight"] = normal(inter, h, std=0.15)
        w[p + "mlp.down_proj.weight"] = normal(h, inter, std=0.15)
        if cfg["model_type"] == "phi3":  # Phi-3's checkpoints fuse q/k/v and gate/up
            w[p + "self_attn.qkv_proj.weight"] = np.concatenate(
                [w.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
            w[p + "mlp.gate_up_proj.weight"] = np.concatenate(
                [w.pop(p + "mlp.gate_proj.weight"), w.pop(p + "mlp.up_proj.weight")])
    return w


def write_model(out_dir, name, cfg, tok, tok_config, dtype, seed, shards=1, generation_config=None, scale=1.0,
                embed_std=1.0, init_std=None):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    if name in MODEL_TEMPLATES:
        tok_config = dict(tok_config, chat_template=MODEL_TEMPLATES[name])
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f, indent=2, sort_keys=True)
    if generation_config:
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump(generation_config, f, indent=2, sort_keys=True)
    w = make_weights(cfg, seed, scale, embed_std, init_std)
    if shards == 1:
        save_safetensors(os.path.join(d, "model.safetensors"), w, dtype)
        return
    names = sorted(w)
    weight_map = {}
    for s in range(shards):
        part = {n: w[n] for n in names[s::shards]}
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_safetensors(os.path.join(d, fname), part, dtype)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2, sort_keys=True)


def base_config(arch, model_type, vocab, **kw):
    cfg = {"architectures": [arch], "model_type": model_type, "vocab_size": vocab, "hidden_size": 64,
           "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
           "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
           "torch_dtype": "float32"}
    cfg.update(kw)
    return cfg


def gemma3_config(**kw):
    """Gemma 3 (text) over base_config: 6 layers of which the 6th is global and the others see a 16-token window,
    each kind with its own rotary base, GeGLU, no soft caps, bf16; kw sets the shape."""
    cfg = base_config("Gemma3ForCausalLM", "gemma3_text", 704, num_hidden_layers=6, num_key_value_heads=1,
                      rms_norm_eps=1e-6, sliding_window=16, layer_types=["sliding_attention"] * 5 + ["full_attention"],
                      rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                      hidden_activation="gelu_pytorch_tanh", final_logit_softcapping=None,
                      attn_logit_softcapping=None, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      torch_dtype="bfloat16", **kw)
    del cfg["hidden_act"]
    return cfg


def gemma2_config(**kw):
    """Gemma 2 over base_config: 6 layers alternating a 16-token window and global attention on one rotary base,
    GeGLU, no per-head norms, soft caps on the attention scores and the logits (by default small enough to move the
    tiny model's logits by up to 3.3, measured with transformers), bf16; kw sets the shape."""
    kw = {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0, **kw}
    cfg = base_config("Gemma2ForCausalLM", "gemma2", 704, num_hidden_layers=6, num_key_value_heads=1,
                      rms_norm_eps=1e-6, sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 3,
                      rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                      hidden_activation="gelu_pytorch_tanh", bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      torch_dtype="bfloat16", **kw)
    del cfg["hidden_act"]
    return cfg


def smollm2_shaped(out_dir):
    """A random-weight model with SmolLM2-135M's shape (not committed): for CPU speed measurements."""
    tok = byte_level(LLAMA3_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], nfc=False, template_bos=None,
                     vocab_size=600)
    cfg = base_config("LlamaForCausalLM", "llama", 49152, hidden_size=576, intermediate_size=1536,
                      num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rope_theta=100000.0, tie_word_embeddings=True, eos_token_id=0, torch_dtype="bfloat16")
    write_model(out_dir, "smollm2-shape-random", cfg, tok, {"eos_token": "<|endoftext|>"}, "BF16", seed=5)


def gpu_models(out_dir):
    """Random-weight models with the head dims the cuda backend serves (64, 128) and GQA groups 4, 2 and 3; made
    on the GPU machine by scripts/gpu_run.sh, not committed. Projections are scaled down for their width so that
    a bf16 rounding does not flip tokens whose logits are 0.1 apart (transformers' own bf16 run does at scale 1)."""
    tok = byte_level(LLAMA3_PATTERN, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], nfc=False,
                     template_bos="<|begin_of_text|>", vocab_size=640)
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    cfg = base_config("LlamaForCausalLM", "llama", 640, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                      num_key_value_heads=1, bos_token_id=bos, eos_token_id=eos,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64},
                      torch_dtype="bfloat16")
    write_model(out_dir, "llama3-hd64", cfg, tok, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
                "BF16", seed=11, scale=0.25)
    tok = byte_level(QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], nfc=True, template_bos=None,
                     vocab_size=600)
    eos = tok.token_to_id("<|endoftext|>")
    cfg = base_config("Qwen2ForCausalLM", "qwen2", 608, hidden_size=512, intermediate_size=768, num_attention_heads=4,
                      num_key_value_heads=2, rope_theta=1e6, tie_word_embeddings=True, eos_token_id=eos,
                      bos_token_id=eos, torch_dtype="bfloat16", use_sliding_window=False, sliding_window=512)
    write_model(out_dir, "qwen2-hd128", cfg, tok, {"eos_token": "<|endoftext|>"}, "BF16", seed=12, scale=0.3,
                embed_std=0.15)  # tied: the embeddings are the LM head, so they set the logits' scale
    tok = sentencepiece_like(metaspace=True, vocab_size=720)
    cfg = base_config("MistralForCausalLM", "mistral", 720, hidden_size=384, intermediate_size=640,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=128, rope_theta=1e6,
                      sliding_window=None, bos_token_id=1, eos_token_id=2, torch_dtype="float16")
    write_model(out_dir, "mistral-hd128-g3", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>"}, "F16", seed=13,
                scale=0.15)
    family_gpu_models(out_dir)
    moe_gpu_models(out_dir)
    sharp_models(out_dir)


def moe_gpu_models(out_dir):
    """Mixtures of experts at head dims the cuda backend serves: Mixtral's layer (every layer sparse, 8 experts, top
    2 renormalised) and Qwen3-MoE's like Qwen3-30B-A3B's (128 experts, top 8 renormalised, q/k norms, Qwen3-8B's
    grouping), with a dense layer among them (mlp_only_layers); enough experts that a step leaves some unchosen, and
    contexts for the long prompts their references take."""
    tok = sentencepiece_like(metaspace=False, vocab_size=700)
    cfg = base_config("MixtralForCausalLM", "mixtral", 704, hidden_size=512, intermediate_size=256,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128, rope_theta=1e6,
                      num_local_experts=8, num_experts_per_tok=2, sliding_window=None, router_jitter_noise=0.0,
                      bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16", max_position_embeddings=4096)
    write_model(out_dir, "mixtral-hd128", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "BF16", seed=18, scale=0.3)
    tok = byte_level(QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], nfc=True, template_bos=None,
                     vocab_size=600)
    eos = tok.token_to_id("<|endoftext|>")
    cfg = base_config("Qwen3MoeForCausalLM", "qwen3_moe", 608, num_hidden_layers=4, hidden_size=512,
                      intermediate_size=768, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                      rope_theta=1e6, tie_word_embeddings=True, eos_token_id=eos, bos_token_id=eos,
                      torch_dtype="bfloat16", attention_bias=False, use_sliding_window=False, sliding_window=None,
                      num_experts=128, num_experts_per_tok=8, moe_intermediate_size=64, norm_topk_prob=True,
                      decoder_sparse_step=1, mlp_only_layers=[1], router_aux_loss_coef=0.0,
                      max_position_embeddings=4096)
    write_model(out_dir, "qwen3-moe-hd128", cfg, tok, {"eos_token": "<|endoftext|>"}, "BF16", seed=19, scale=0.3,
                embed_std=0.3)  # tied: wider embeddings, wider logit margins


def family_gpu_models(out_dir):
    """The newer families at head dims the cuda backend serves: Qwen3 with Qwen3-8B's grouping (4 query heads per
    KV head of 128, wider than hidden / heads), Gemma 3 with Gemma 3 270M's one KV head of 256 and 5 sliding-window
    layers (a 16-token window, shorter than the prompts) to one global, and Phi-4-mini's partial rotary (96 of 128)
    with LongRoPE's short factors and its multiplier, and Phi-3-mini's heads of 96. Gemma's embeddings are untied here: tied, the √hidden-scaled
    input embedding dominates the residual and the model repeats its input with logit margins of ~40, which
    compares nothing."""
    tok = byte_level(QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], nfc=True, template_bos=None,
                     vocab_size=600)
    eos = tok.token_to_id("<|endoftext|>")
    cfg = base_config("Qwen3ForCausalLM", "qwen3", 608, hidden_size=512, intermediate_size=768, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=128, rope_theta=1e6, tie_word_embeddings=True, eos_token_id=eos,
                      bos_token_id=eos, torch_dtype="bfloat16", attention_bias=False, use_sliding_window=False,
                      sliding_window=None)
    write_model(out_dir, "qwen3-hd128", cfg, tok, {"eos_token": "<|endoftext|>"}, "BF16", seed=14, scale=0.3,
                embed_std=0.15)
    tok = sentencepiece_like(metaspace=False, vocab_size=700)
    cfg = gemma3_config(hidden_size=512, intermediate_size=1024, num_attention_heads=4, head_dim=256,
                        query_pre_attn_scalar=256, tie_word_embeddings=False)
    write_model(out_dir, "gemma3-hd256", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "BF16", seed=15, scale=0.3, embed_std=0.15)
    # Gemma 2 at the same width (head_dim 256 as Gemma 2 2B and 9B): soft-capped scores, in window and global
    # layers; Gemma 2's own final cap, 30 (at 4 every top logit of this model sat at the cap, margins 0). Caps on
    # the scores of 1, 2, 4, 8 and 16 each gave other tokens; from 4 up the greedy runs keep margins over 0.25 long
    # enough to compare (at 1 the first margins fell under it).
    cfg = gemma2_config(hidden_size=512, intermediate_size=1024, num_attention_heads=4, head_dim=256,
                        query_pre_attn_scalar=256, tie_word_embeddings=False, attn_logit_softcapping=4.0,
                        final_logit_softcapping=30.0)
    write_model(out_dir, "gemma2-hd256", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "BF16", seed=15, scale=0.3, embed_std=0.15)
    rng = np.random.default_rng(16)
    short = [round(float(x), 4) for x in 1.0 + rng.uniform(0, 0.5, 48)]
    long = [round(float(x), 4) for x in 1.0 + rng.uniform(0, 8, 48)]
    cfg = base_config("Phi3ForCausalLM", "phi3", 704, hidden_size=512, intermediate_size=1024, num_attention_heads=4,
                      num_key_value_heads=2, rope_theta=10000.0, max_position_embeddings=16384,
                      original_max_position_embeddings=4096, partial_rotary_factor=0.75, sliding_window=None,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0,
                      rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long},
                      torch_dtype="bfloat16")
    write_model(out_dir, "phi3-hd128", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "BF16", seed=17, scale=0.3)
    # Phi-3-mini's heads: 96 wide, as many KV heads as query heads, rotary over the whole head with LongRoPE. The
    # cuda backend runs them padded to 128 (engine/model/head_padding.h).
    short = [round(float(x), 4) for x in 1.0 + rng.uniform(0, 0.5, 48)]
    long = [round(float(x), 4) for x in 1.0 + rng.uniform(0, 8, 48)]
    cfg = base_config("Phi3ForCausalLM", "phi3", 704, hidden_size=384, intermediate_size=1024, num_attention_heads=4,
                      num_key_value_heads=4, rope_theta=10000.0, max_position_embeddings=16384,
                      original_max_position_embeddings=4096, sliding_window=None, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long},
                      torch_dtype="bfloat16")
    write_model(out_dir, "phi3-hd96", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "BF16", seed=18, scale=0.3)


def sharp_models(out_dir):
    """Llama-family shapes with every weight drawn with std 0.2 (transformers' initializer_range 0.2): activations
    in the hundreds and attention logits of std ~20, so attention is sharp and any rounding or reduction in 16
    bits that a kernel adds shows in the greedy tokens. GQA groups 1, 4, 7 and 8, one KV head, head dims 64, 128
    and 256, context up to 4096. Made on the GPU machine, not committed; their references use LONG_PROMPTS too."""
    qwen_tok = byte_level(QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], nfc=True,
                          template_bos=None, vocab_size=1100)
    eos = qwen_tok.token_to_id("<|endoftext|>")
    qwen = dict(rope_theta=1e6, tie_word_embeddings=True, eos_token_id=eos, bos_token_id=eos, torch_dtype="bfloat16",
                use_sliding_window=False, sliding_window=4096, max_position_embeddings=4096, initializer_range=0.2)
    # The shape: 4 query heads on 1 KV head of 128, q/k/v biases, tied embeddings.
    cfg = base_config("Qwen2ForCausalLM", "qwen2", 1100, hidden_size=512, intermediate_size=1024,
                      num_attention_heads=4, num_key_value_heads=1, **qwen)
    write_model(out_dir, "qwen2-hd128-g4-kv1-sharp", cfg, qwen_tok, {"eos_token": "<|endoftext|>"}, "BF16", seed=21,
                init_std=0.2)
    # Qwen2.5-0.5B-like: 7 query heads on 1 KV head of 64.
    cfg = base_config("Qwen2ForCausalLM", "qwen2", 1100, hidden_size=448, intermediate_size=896,
                      num_attention_heads=7, num_key_value_heads=1, **qwen)
    write_model(out_dir, "qwen2-hd64-g7-sharp", cfg, qwen_tok, {"eos_token": "<|endoftext|>"}, "BF16", seed=22,
                init_std=0.2)
    llama_tok = byte_level(LLAMA3_PATTERN, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], nfc=False,
                           template_bos="<|begin_of_text|>", vocab_size=1100)
    bos, eos = llama_tok.token_to_id("<|begin_of_text|>"), llama_tok.token_to_id("<|end_of_text|>")
    llama_cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    # Llama-3.2-1B-like: group 4 of head dim 64, tied, llama3 rope.
    cfg = base_config("LlamaForCausalLM", "llama", 1100, hidden_size=512, intermediate_size=1024,
                      num_attention_heads=8, num_key_value_heads=2, bos_token_id=bos, eos_token_id=eos,
                      tie_word_embeddings=True, max_position_embeddings=4096, initializer_range=0.2,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 1024},
                      torch_dtype="bfloat16")
    write_model(out_dir, "llama3-hd64-g4-sharp", cfg, llama_tok, llama_cfg, "BF16", seed=23, init_std=0.2)
    # Head dim 256, 8 query heads on 1 KV head, untied.
    cfg = base_config("LlamaForCausalLM", "llama", 1100, hidden_size=512, intermediate_size=1024,
                      num_attention_heads=8, num_key_value_heads=1, head_dim=256, bos_token_id=bos,
                      eos_token_id=eos, max_position_embeddings=4096, rope_theta=10000.0, initializer_range=0.2,
                      torch_dtype="bfloat16")
    write_model(out_dir, "llama-hd256-g8-sharp", cfg, llama_tok, llama_cfg, "BF16", seed=24, init_std=0.2)
    # Mistral-like without grouping (group 1), head dim 128, Metaspace tokenizer, fp16 checkpoint.
    cfg = base_config("MistralForCausalLM", "mistral", 1100, hidden_size=512, intermediate_size=1024,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=128, rope_theta=1e6,
                      sliding_window=None, bos_token_id=1, eos_token_id=2, max_position_embeddings=4096,
                      initializer_range=0.2, torch_dtype="float16")
    write_model(out_dir, "mistral-hd128-g1-sharp", cfg, sentencepiece_like(metaspace=True, vocab_size=1100),
                {"bos_token": "<s>", "eos_token": "</s>"}, "F16", seed=25, init_std=0.2)


def gemma2_tiny(out):
    """Gemma 2 at gemma3-tiny's shape: one KV head of head_dim 32, tied, window and global layers alternating, soft
    caps on the scores and the logits."""
    tok = sentencepiece_like(metaspace=False, vocab_size=700)
    cfg = gemma2_config(head_dim=32, query_pre_attn_scalar=32, tie_word_embeddings=True)
    write_model(out, "gemma2-tiny", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "BF16", seed=6, embed_std=0.15)


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--smollm2-shape":
        smollm2_shaped(sys.argv[2])
        return
    if len(sys.argv) > 2 and sys.argv[1] == "--gpu-models":
        gpu_models(sys.argv[2])
        return
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/models"
    # Llama 2: SentencePiece-style tokenizer (Prepend+Replace), MHA, untied, fp32, transformers 4 rope fields.
    tok = sentencepiece_like(metaspace=False, vocab_size=700)
    cfg = base_config("LlamaForCausalLM", "llama", 704, rope_theta=10000.0, bos_token_id=1, eos_token_id=2)
    write_model(out, "llama2-tiny", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "F32", seed=1)
    # Llama 3: byte-level BPE with the Llama 3 regex, GQA, llama3 rope scaling in transformers 5 style, bf16.
    tok = byte_level(LLAMA3_PATTERN, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], nfc=False,
                     template_bos="<|begin_of_text|>", vocab_size=640)
    bos, eos, eot = (tok.token_to_id(t) for t in ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])
    cfg = base_config("LlamaForCausalLM", "llama", 640, num_key_value_heads=2, bos_token_id=bos, eos_token_id=eos,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64},
                      torch_dtype="bfloat16")
    write_model(out, "llama3-tiny", cfg, tok, {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
                "BF16", seed=2, generation_config={"bos_token_id": bos, "eos_token_id": [eos, eot]})
    # Mistral: Metaspace tokenizer, GQA with an explicit head_dim, fp16, two shards.
    tok = sentencepiece_like(metaspace=True, vocab_size=720)
    cfg = base_config("MistralForCausalLM", "mistral", 720, num_key_value_heads=2, head_dim=32, rope_theta=1e6,
                      sliding_window=None, bos_token_id=1, eos_token_id=2, torch_dtype="float16")
    write_model(out, "mistral-tiny", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>"}, "F16", seed=3, shards=2)
    # Qwen2: byte-level BPE with the Qwen2 regex and NFC, QKV bias, tied embeddings, bf16.
    tok = byte_level(QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], nfc=True, template_bos=None,
                     vocab_size=600)
    eos = tok.token_to_id("<|endoftext|>")
    cfg = base_config("Qwen2ForCausalLM", "qwen2", 608, num_key_value_heads=1, rope_theta=1e6,
                      tie_word_embeddings=True, eos_token_id=eos, bos_token_id=eos, torch_dtype="bfloat16",
                      use_sliding_window=False, sliding_window=512)
    write_model(out, "qwen2-tiny", cfg, tok, {"eos_token": "<|endoftext|>"}, "BF16", seed=4,
                generation_config={"eos_token_id": [tok.token_to_id("<|im_end|>"), eos]})
    # Qwen3 (dense): Qwen2's tokenizer, per-head q/k norms, no QKV bias, a head_dim wider than hidden / heads (as
    # Qwen3-0.6B's 128 against 1024 / 16), GQA, tied embeddings, bf16.
    cfg = base_config("Qwen3ForCausalLM", "qwen3", 608, num_key_value_heads=2, head_dim=32, rope_theta=1e6,
                      tie_word_embeddings=True, eos_token_id=eos, bos_token_id=eos, torch_dtype="bfloat16",
                      attention_bias=False, use_sliding_window=False, sliding_window=None)
    write_model(out, "qwen3-tiny", cfg, tok, {"eos_token": "<|endoftext|>"}, "BF16", seed=5,
                generation_config={"eos_token_id": [tok.token_to_id("<|im_end|>"), eos]})
    # Gemma 3 (text): a SentencePiece-style tokenizer, 6 layers of which every 6th is global and the others see a
    # 16-token window (shorter than the prompts), each kind with its own rotary base; sandwich norms stored as
    # w of 1 + w, q/k norms, GeGLU, embeddings scaled by √hidden, one KV head of head_dim 32, tied, bf16.
    tok = sentencepiece_like(metaspace=False, vocab_size=700)
    cfg = gemma3_config(head_dim=32, query_pre_attn_scalar=32, tie_word_embeddings=True)
    write_model(out, "gemma3-tiny", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "BF16", seed=6, embed_std=0.15)
    gemma2_tiny(out)
    # Phi-3: fused qkv_proj and gate_up_proj, LongRoPE (short factors below 256 positions, long from there; cos
    # and sin scaled for 2048 / 256) on 12 of each head's 16 dimensions (partial_rotary_factor, as Phi-4-mini),
    # GQA, untied, bf16.
    rng = np.random.default_rng(8)
    short = [round(float(x), 4) for x in 1.0 + rng.uniform(0, 0.5, 6)]
    long = [round(float(x), 4) for x in 1.0 + rng.uniform(0, 8, 6)]
    cfg = base_config("Phi3ForCausalLM", "phi3", 704, num_key_value_heads=2, rope_theta=10000.0,
                      max_position_embeddings=2048, original_max_position_embeddings=256,
                      partial_rotary_factor=0.75, sliding_window=None, bos_token_id=1, eos_token_id=2,
                      pad_token_id=0, rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long},
                      torch_dtype="bfloat16")
    write_model(out, "phi3-tiny", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "BF16", seed=7)
    # Mixtral: Llama's attention and tokenizer style, every layer a mixture of 4 experts of which each token takes
    # 2 (weights renormalised), GQA, untied, bf16.
    tok = sentencepiece_like(metaspace=False, vocab_size=700)
    cfg = base_config("MixtralForCausalLM", "mixtral", 704, num_key_value_heads=2, rope_theta=1e6,
                      num_local_experts=4, num_experts_per_tok=2, intermediate_size=96, sliding_window=None,
                      router_jitter_noise=0.0, bos_token_id=1, eos_token_id=2, torch_dtype="bfloat16")
    write_model(out, "mixtral-tiny", cfg, tok, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
                "BF16", seed=9)
    # Qwen3-MoE: Qwen3's attention (q/k norms, head_dim 32) and Qwen2's tokenizer; 3 layers, the middle one dense
    # (mlp_only_layers), the others a mixture of 8 experts of width 32 of which each token takes 2, their weights
    # not renormalised (norm_topk_prob false: the other way from Mixtral's), tied embeddings, bf16.
    tok = byte_level(QWEN2_PATTERN, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], nfc=True, template_bos=None,
                     vocab_size=600)
    eos = tok.token_to_id("<|endoftext|>")
    cfg = base_config("Qwen3MoeForCausalLM", "qwen3_moe", 608, num_hidden_layers=3, num_key_value_heads=2,
                      head_dim=32, rope_theta=1e6, tie_word_embeddings=True, eos_token_id=eos, bos_token_id=eos,
                      torch_dtype="bfloat16", attention_bias=False, use_sliding_window=False, sliding_window=None,
                      num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False,
                      decoder_sparse_step=1, mlp_only_layers=[1], router_aux_loss_coef=0.0)
    write_model(out, "qwen3-moe-tiny", cfg, tok, {"eos_token": "<|endoftext|>"}, "BF16", seed=10,
                generation_config={"eos_token_id": [tok.token_to_id("<|im_end|>"), eos]})


if __name__ == "__main__":
    main()
