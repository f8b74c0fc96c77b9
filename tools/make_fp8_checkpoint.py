#!/usr/bin/env python3
"""Writes an FP8 checkpoint of a Hugging Face model directory, in one of the two layouts inferd reads:

    python3 tools/make_fp8_checkpoint.py SRC DST [--format compressed-tensors|fp8] [--weights channel|tensor]
                                         [--kv-scales K,V]

--format compressed-tensors (default): llm-compressor's "float-quantized" layout: each layer's linear weights
  F8_E4M3 with `weight_scale` ([rows, 1] per channel, [1] per tensor), dynamic per-token input activations,
  `ignore: ["lm_head"]` (and the mixtures' routers).
--kv-scales K,V (compressed-tensors only): a `kv_cache_scheme` (8-bit float, per tensor, static) and every layer's
  `self_attn.k_scale` = K and `self_attn.v_scale` = V ([1] F32), the scales of an fp8 KV cache. llm-compressor
  calibrates them on data; this script writes the constants given.
--format fp8: the older `quant_method: fp8` layout (per-tensor `weight_scale` and a static per-tensor
  `input_scale`, activation_scheme "static"); --weights is then tensor.

Quantization is inferd's own (`engine.quantization: fp8`): the weight rounded to bf16, scale = max |w| / 448 over
the row (or the tensor), e4m3 = round to nearest even of w / scale. Per channel, the checkpoint therefore holds
bit for bit the weights inferd makes from SRC at load. numpy only; deterministic.
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

# The layers' products, and each expert's (Mixtral names them w1, w3, w2); the routers (`mlp.gate`,
# `block_sparse_moe.gate`) stay in 16 bits, as llm-compressor leaves them.
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "w1", "w2", "w3")
FP8_MAX = 448.0


def e4m3_values():
    """The float value of each of the 127 non-negative finite e4m3 codes 0x00..0x7E (0x7F is NaN)."""
    codes = np.arange(0x7F)
    exp, man = codes >> 3, codes & 7
    return np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7.0)).astype(np.float64)


VALUES = e4m3_values()


def to_e4m3(x):
    """Round-to-nearest-even e4m3 codes of float32 x, saturating at 448."""
    a = np.minimum(np.abs(x.astype(np.float64)), FP8_MAX)
    hi = np.clip(np.searchsorted(VALUES, a, side="left"), 0, len(VALUES) - 1)
    lo = np.clip(hi - 1, 0, len(VALUES) - 1)
    d_lo, d_hi = a - VALUES[lo], VALUES[hi] - a
    code = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(lo % 2 == 0, lo, hi)))
    code = np.where(VALUES[hi] == a, hi, code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = np.frombuffer(data[b:e], dtype={"F32": np.float32, "F16": np.float16, "BF16": np.uint16}[t["dtype"]])
        if t["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = raw.astype(np.float32).reshape(t["shape"])
    return out


def bf16_round(a):
    bits = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32)


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
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


def quantize(w, per_channel):
    w = bf16_round(w)
    amax = np.abs(w).max(axis=1, keepdims=True) if per_channel else np.abs(w).max(keepdims=True).reshape(1, 1)
    scale = np.where(amax > 0, (amax / np.float32(FP8_MAX)).astype(np.float32), np.float32(1.0)).astype(np.float32)
    return to_e4m3((w / scale).astype(np.float32)), scale


def main():
    p = argparse.ArgumentParser()
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--format", choices=["compressed-tensors", "fp8"], default="compressed-tensors")
    p.add_argument("--weights", choices=["channel", "tensor"], default="channel")
    p.add_argument("--kv-scales", help="K,V: per-tensor KV cache scales for every layer")
    args = p.parse_args()
    if args.kv_scales and args.format != "compressed-tensors":
        p.error("--kv-scales needs --format compressed-tensors")
    kv_scales = [float(x) for x in args.kv_scales.split(",")] if args.kv_scales else None
    if kv_scales is not None and (len(kv_scales) != 2 or min(kv_scales) <= 0):
        p.error("--kv-scales takes two positive numbers, K,V")
    per_channel = args.weights == "channel" and args.format == "compressed-tensors"
    os.makedirs(args.dst, exist_ok=True)
    for f in os.listdir(args.src):
        if not f.endswith(".safetensors") and f != "model.safetensors.index.json":
            shutil.copy(os.path.join(args.src, f), os.path.join(args.dst, f))
    weights = {}
    for f in sorted(os.listdir(args.src)):
        if f.endswith(".safetensors"):
            weights.update(read_safetensors(os.path.join(args.src, f)))
    out = {}
    for name, w in weights.items():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] in LINEAR and parts[-1] == "weight" and ".layers." in name:
            q, scale = quantize(w, per_channel)
            base = name[: -len(".weight")]
            out[name] = ("F8_E4M3", w.shape, q.tobytes())
            shape = [w.shape[0], 1] if per_channel else [1]
            out[base + ".weight_scale"] = ("F32", shape, scale.reshape(shape).astype(np.float32).tobytes())
            if args.format == "fp8":  # a static per-tensor input scale, as the older format stores one
                out[base + ".input_scale"] = ("F32", [1], np.array([1.0 / 16], np.float32).tobytes())
        else:
            out[name] = ("BF16", w.shape, (bf16_round(w).view(np.uint32) >> 16).astype(np.uint16).tobytes())
        if kv_scales is not None and name.endswith(".self_attn.k_proj.weight"):
            base = name[: -len("k_proj.weight")]
            for which, value in zip(("k_scale", "v_scale"), kv_scales):
                out[base + which] = ("F32", [1], np.array([value], np.float32).tobytes())
    write_safetensors(os.path.join(args.dst, "model.safetensors"), out)
    with open(os.path.join(args.src, "config.json")) as f:
        config = json.load(f)
    if args.format == "fp8":
        config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    else:
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*block_sparse_moe.gate$"],
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": args.weights, "dynamic": False,
                            "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True,
                                      "symmetric": True},
            }},
        }
        if kv_scales is not None:
            config["quantization_config"]["kv_cache_scheme"] = {
                "num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    with open(os.path.join(args.dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"wrote {args.dst}: {args.format}, weights per {'channel' if per_channel else 'tensor'}"
          + (f", KV cache scales {kv_scales[0]} and {kv_scales[1]}" if kv_scales else ""))


if __name__ == "__main__":
    main()
