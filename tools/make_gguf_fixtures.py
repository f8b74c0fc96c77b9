#!/usr/bin/env python3
"""Makes the GGUF test fixtures with the `gguf` package (llama.cpp's own writer and dequantizer):

  tests/fixtures/models/llama2-tiny.gguf   llama2-tiny as llama.cpp's converter lays it out: F32, q/k rows
                                           permuted to the interleaved rotary order, a `llama` (sentencepiece)
                                           tokenizer with scores, token types and the chat template
  tests/fixtures/models/qwen2-tiny.gguf    qwen2-tiny: BF16, QKV bias, tied embeddings, a `gpt2` tokenizer
                                           with merges and tokenizer.ggml.pre = qwen2
  tests/fixtures/models/qwen3-tiny.gguf    qwen3-tiny: the same tokenizer, per-head q/k norms, head_dim 32
  tests/fixtures/models/gemma3-tiny.gguf   gemma3-tiny: norms stored as 1 + w, sliding window, sandwich norms
  tests/fixtures/models/phi3-tiny.gguf     phi3-tiny: fused attn_qkv and ffn_up, LongRoPE factors as tensors
  tests/fixtures/models/mixtral-tiny.gguf  mixtral-tiny as llama.cpp writes Mixtral: "llama" with expert_count,
                                           the router (ffn_gate_inp) and the experts stacked in 3-D tensors
  tests/fixtures/models/qwen3-moe-tiny.gguf
                                           qwen3-moe-tiny: "qwen3moe", expert_feed_forward_length,
                                           expert_weights_norm false, its dense layer without a router
  tests/fixtures/models/qwen3-moe-tiny-experts-q8_0.gguf
                                           the same with its stacked experts in Q8_0
  tests/fixtures/gguf/quants.gguf + .json  random blocks of every quantized type inferd reads and the values
                                           gguf.quants.dequantize gives for them
  tests/fixtures/tokenizer/smollm2-gguf.json
                                           the ids Hugging Face `tokenizers` gives on the hard-string corpus
                                           for SmolLM2's tokenizer, built from the bundled GGUF's vocabulary
                                           and merges with SmolLM2's published pre-tokenizer (digits one by
                                           one, then GPT-2 byte-level)

    .venv/bin/python tools/make_gguf_fixtures.py
"""
import json
import math
import os
import struct
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, AddedToken

sys.path.insert(0, os.path.dirname(__file__))
from chat_templates import MODEL_TEMPLATES  # noqa: E402
from make_tokenizer_fixtures import HARD_STRINGS  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MODELS = os.path.join(ROOT, "tests", "fixtures", "models")


def read_safetensors(d):
    """{name: (numpy array of the stored element type, dtype string)} from model.safetensors or its shards."""
    files = [f for f in sorted(os.listdir(d)) if f.endswith(".safetensors")]
    out = {}
    for fname in files:
        raw = open(os.path.join(d, fname), "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        header = json.loads(raw[8:8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            np_type = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[info["dtype"]]
            out[name] = (np.frombuffer(raw[8 + n + b:8 + n + e], dtype=np_type).reshape(info["shape"]), info["dtype"])
    return out


def permute(w, n_head):
    """llama.cpp's converter: each head's rotary halves become interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add(writer, name, arr, dtype):
    if arr.dtype == np.float32:  # converted here (Gemma's norms): F32 whatever the checkpoint's type
        dtype = "F32"
    ggml = {"F32": Q.F32, "F16": Q.F16, "BF16": Q.BF16}[dtype]
    arr = np.ascontiguousarray(arr)
    if dtype == "BF16":
        writer.add_tensor(name, arr.view(np.uint8), raw_dtype=ggml)
    else:
        writer.add_tensor(name, arr, raw_dtype=ggml)


def convert(name, arch, tokenizer_kind, experts_q8_0=False):
    d = os.path.join(MODELS, name)
    cfg = json.load(open(os.path.join(d, "config.json")))
    tok = json.load(open(os.path.join(d, "tokenizer.json")))
    tok_cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
    w = read_safetensors(d)
    out_name = f"{name}-experts-q8_0" if experts_q8_0 else name
    writer = gguf.GGUFWriter(os.path.join(MODELS, f"{out_name}.gguf"), arch)
    writer.add_name(name)
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv)
    gemma = arch == "gemma3"
    if gemma:  # llama.cpp's Gemma 3: global base here, sliding layers at 10000, every 6th layer global
        writer.add_rope_freq_base(cfg["rope_parameters"]["full_attention"]["rope_theta"])
        writer.add_sliding_window(cfg["sliding_window"])
    else:
        writer.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // heads)
    if "head_dim" in cfg:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    rotary = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
    writer.add_rope_dimension_count(rotary)
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("type") == "longrope":  # as llama.cpp's Phi-3 converter: factors as tensors, two keys
        orig = cfg["original_max_position_embeddings"]
        factor = cfg["max_position_embeddings"] / orig
        writer.add_uint32(f"{arch}.rope.scaling.original_context_length", orig)
        writer.add_float32(f"{arch}.rope.scaling.attn_factor", math.sqrt(1 + math.log(factor) / math.log(orig)))
        writer.add_tensor("rope_factors_long.weight", np.array(scaling["long_factor"], np.float32), raw_dtype=Q.F32)
        writer.add_tensor("rope_factors_short.weight", np.array(scaling["short_factor"], np.float32), raw_dtype=Q.F32)
    writer.add_vocab_size(cfg["vocab_size"])
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    if experts:  # as llama.cpp's converters write Mixtral ("llama") and Qwen3-MoE ("qwen3moe")
        writer.add_expert_count(experts)
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        writer.add_bool(f"{arch}.expert_weights_norm", bool(cfg.get("norm_topk_prob", True)))

    vocab = tok["model"]["vocab"]
    for a in tok["added_tokens"]:
        vocab[a["content"]] = a["id"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    specials = {a["content"] for a in tok["added_tokens"] if a["special"]}
    types = []
    for t in tokens:
        if t == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        elif t in specials:
            types.append(gguf.TokenType.CONTROL)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if tokenizer_kind == "llama":
        writer.add_tokenizer_model("llama")
        # A sentencepiece vocabulary ranks pieces by score: the piece a merge makes scores by its rank.
        rank = {m.replace(" ", ""): i for i, m in reversed(list(enumerate(merges)))}
        writer.add_token_scores([-float(rank[t] + 1) if t in rank and types[i] == gguf.TokenType.NORMAL else 0.0
                                 for i, t in enumerate(tokens)])
        writer.add_bos_token_id(vocab["<s>"])
        writer.add_eos_token_id(vocab["</s>"])
        writer.add_unk_token_id(vocab["<unk>"])
        writer.add_add_bos_token(True)
        writer.add_add_space_prefix(True)
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2")
        writer.add_token_merges(merges)
        writer.add_eos_token_id(vocab[tok_cfg["eos_token"]])
        writer.add_add_bos_token(False)
    writer.add_chat_template(MODEL_TEMPLATES[name])

    def t(hf):
        if gemma and hf.endswith("norm.weight"):  # llama.cpp's converter stores Gemma's 1 + w, as F32
            arr, dt = w[hf]
            f32 = (arr.astype(np.uint32) << 16).view(np.float32) if dt == "BF16" else arr.astype(np.float32)
            return f32 + np.float32(1), "F32"
        return w[hf]

    dtype = next(iter(w.values()))[1]
    add(writer, "token_embd.weight", t("model.embed_tokens.weight")[0], dtype)
    add(writer, "output_norm.weight", t("model.norm.weight")[0], dtype)
    if "lm_head.weight" in w:
        add(writer, "output.weight", t("lm_head.weight")[0], dtype)
    for layer in range(cfg["num_hidden_layers"]):
        p, g = f"model.layers.{layer}.", f"blk.{layer}."
        add(writer, g + "attn_norm.weight", t(p + "input_layernorm.weight")[0], dtype)
        if arch == "phi3":  # fused as in the checkpoint: attn_qkv, and ffn_up holding gate then up
            add(writer, g + "attn_qkv.weight", t(p + "self_attn.qkv_proj.weight")[0], dtype)
        else:
            q, k = t(p + "self_attn.q_proj.weight")[0], t(p + "self_attn.k_proj.weight")[0]
            if arch == "llama":
                q, k = permute(q, heads), permute(k, kv)
            add(writer, g + "attn_q.weight", q, dtype)
            add(writer, g + "attn_k.weight", k, dtype)
            add(writer, g + "attn_v.weight", t(p + "self_attn.v_proj.weight")[0], dtype)
        if p + "self_attn.q_proj.bias" in w:
            for x in "qkv":
                add(writer, g + f"attn_{x}.bias", t(p + f"self_attn.{x}_proj.bias")[0], dtype)
        if p + "self_attn.q_norm.weight" in w:  # qwen3's per-head norms
            add(writer, g + "attn_q_norm.weight", t(p + "self_attn.q_norm.weight")[0], dtype)
            add(writer, g + "attn_k_norm.weight", t(p + "self_attn.k_norm.weight")[0], dtype)
        add(writer, g + "attn_output.weight", t(p + "self_attn.o_proj.weight")[0], dtype)
        if gemma:
            add(writer, g + "post_attention_norm.weight", t(p + "post_attention_layernorm.weight")[0], dtype)
            add(writer, g + "ffn_norm.weight", t(p + "pre_feedforward_layernorm.weight")[0], dtype)
            add(writer, g + "post_ffw_norm.weight", t(p + "post_feedforward_layernorm.weight")[0], dtype)
        else:
            add(writer, g + "ffn_norm.weight", t(p + "post_attention_layernorm.weight")[0], dtype)
        moe = next((m for m in ("mlp.", "block_sparse_moe.") if p + m + "gate.weight" in w), None)
        if moe:  # a sparse layer: the router, and each of gate, up and down stacked over the experts
            add(writer, g + "ffn_gate_inp.weight", t(p + moe + "gate.weight")[0], dtype)
            names = {"mlp.": ("gate_proj", "up_proj", "down_proj"), "block_sparse_moe.": ("w1", "w3", "w2")}[moe]
            for stacked, hf in zip(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), names):
                arr = np.stack([t(p + f"{moe}experts.{e}.{hf}.weight")[0] for e in range(experts)])
                if experts_q8_0:  # as a quantized file holds them: Q8_0 blocks along each row
                    f32 = (arr.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else arr.astype(np.float32)
                    writer.add_tensor(g + stacked + ".weight", gguf.quants.quantize(f32, Q.Q8_0), raw_dtype=Q.Q8_0)
                else:
                    add(writer, g + stacked + ".weight", arr, dtype)
        elif arch == "phi3":
            add(writer, g + "ffn_up.weight", t(p + "mlp.gate_up_proj.weight")[0], dtype)
        else:
            add(writer, g + "ffn_gate.weight", t(p + "mlp.gate_proj.weight")[0], dtype)
            add(writer, g + "ffn_up.weight", t(p + "mlp.up_proj.weight")[0], dtype)
        if not moe:
            add(writer, g + "ffn_down.weight", t(p + "mlp.down_proj.weight")[0], dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{out_name}.gguf: {arch}, {dtype}{', experts Q8_0' if experts_q8_0 else ''}, {len(tokens)} tokens")


def random_blocks(qtype, rows, cols, rng):
    """Random quantized bytes whose scales are finite, small halves (as a quantizer would write)."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // block_elems
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)

    def halves(k):
        return np.frombuffer(rng.uniform(0.001, 0.05, size=n_blocks * k).astype(np.float16).tobytes(),
                             dtype=np.uint8).reshape(n_blocks, 2 * k)

    if qtype in (Q.Q8_0, Q.Q4_0, Q.Q5_0):
        raw[:, 0:2] = halves(1)
    elif qtype == Q.Q4_1:
        raw[:, 0:4] = halves(2)
    elif qtype == Q.Q4_K:
        raw[:, 0:4] = halves(2)
    elif qtype == Q.Q6_K:
        raw[:, 208:210] = halves(1)
    return raw.reshape(rows, cols // block_elems * block_bytes)


def quants():
    out_dir = os.path.join(ROOT, "tests", "fixtures", "gguf")
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(os.path.join(out_dir, "quants.gguf"), "llama")
    expected = {}
    for qtype in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K):
        rows, cols = 3, 512
        raw = random_blocks(qtype, rows, cols, rng)
        writer.add_tensor(qtype.name.lower(), raw, raw_dtype=qtype)
        expected[qtype.name.lower()] = gguf.quants.dequantize(raw, qtype).reshape(-1).astype(np.float32).tolist()
    for name, arr, qt in (("f16", rng.normal(size=(2, 33)).astype(np.float16), Q.F16),
                          ("f32", rng.normal(size=(5,)).astype(np.float32), Q.F32)):
        writer.add_tensor(name, arr, raw_dtype=qt)
        expected[name] = arr.astype(np.float32).reshape(-1).tolist()
    bf = rng.normal(size=(4, 7)).astype(np.float32)
    bits = (bf.view(np.uint32) >> 16).astype(np.uint16)
    writer.add_tensor("bf16", bits.view(np.uint8), raw_dtype=Q.BF16)
    expected["bf16"] = (bits.astype(np.uint32) << 16).view(np.float32).reshape(-1).tolist()
    raw = random_blocks(Q.Q5_0, 3, 512, rng)  # after the others, so that their bytes stay as they were
    writer.add_tensor("q5_0", raw, raw_dtype=Q.Q5_0)
    expected["q5_0"] = gguf.quants.dequantize(raw, Q.Q5_0).reshape(-1).astype(np.float32).tolist()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with open(os.path.join(out_dir, "quants.json"), "w") as f:
        json.dump({"command": "tools/make_gguf_fixtures.py", "gguf": gguf.__name__, "expected": expected}, f)
    print("quants.gguf:", ", ".join(expected))


def smollm2_tokenizer():
    r = gguf.GGUFReader(os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    f = r.fields["tokenizer.ggml.tokens"]
    tokens = [f.parts[i].tobytes().decode() for i in f.data]
    m = r.fields["tokenizer.ggml.merges"]
    merges = [tuple(m.parts[i].tobytes().decode().split(" ", 1)) for i in m.data]
    tt = r.fields["tokenizer.ggml.token_type"]
    types = [int(tt.parts[i][0]) for i in tt.data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    cases = []
    for text in HARD_STRINGS:
        ids = tok.encode(text, add_special_tokens=True).ids
        cases.append({"text": text, "ids": ids, "ids_no_special": tok.encode(text, add_special_tokens=False).ids,
                      "decoded": tok.decode(ids, skip_special_tokens=True),
                      "decoded_with_special": tok.decode(ids, skip_special_tokens=False)})
    path = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "smollm2-gguf.json")
    with open(path, "w") as fo:
        json.dump({"model": "models/SmolLM2-135M-Instruct.Q4_1.gguf", "command": "tools/make_gguf_fixtures.py",
                   "cases": cases}, fo, indent=1, ensure_ascii=False)
    print("smollm2-gguf.json:", len(cases), "cases")


def main():
    convert("llama2-tiny", "llama", "llama")
    convert("qwen2-tiny", "qwen2", "gpt2")
    convert("qwen3-tiny", "qwen3", "gpt2")
    convert("gemma3-tiny", "gemma3", "llama")
    convert("phi3-tiny", "phi3", "llama")
    convert("mixtral-tiny", "llama", "llama")
    convert("qwen3-moe-tiny", "qwen3moe", "gpt2")
    convert("qwen3-moe-tiny", "qwen3moe", "gpt2", experts_q8_0=True)
    quants()
    smollm2_tokenizer()


if __name__ == "__main__":
    main()
