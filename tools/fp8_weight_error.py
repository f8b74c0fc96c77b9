#!/usr/bin/env python3
"""How far each 8-bit weight format moves a GGUF model's projection weights, as a relative RMS error.

    .venv/bin/python tools/fp8_weight_error.py models/SmolLM2-135M-Instruct.Q4_1.gguf

Every 2-D weight but the token embeddings is dequantized to float64 and rounded to:
  e4m3, a scale per output row (what `engine.quantization: fp8` stores);
  e4m3, a scale per block of 128 and of 32 weights along a row (block-scaled FP8 checkpoints' layouts);
  Q8_0, int8 with a scale per block of 32 (llama.cpp's 8-bit format).
Printed: sqrt(sum of squared errors / sum of squared weights) over all of them, and the same for Gaussian weights of
the same count, which have no 4-bit grid to favour blocks of 32. e4m3 keeps 3 mantissa bits wherever its scale puts a
weight, so finer scales only rescue the few weights that fall below its normal range; int8 spends all 8 bits on a
block's range.
"""
import argparse
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
from make_fp8_checkpoint import VALUES, quantize


def e4m3_blocks(w, block):
    """w [rows, k] as `engine.quantization: fp8` rounds it (bf16, then e4m3: make_fp8_checkpoint.quantize), with a
    scale per `block` weights of a row (None: the whole row)."""
    rows, k = w.shape
    block = block or k
    if k % block:
        raise ValueError(f"row length {k} is not a multiple of the block {block}")
    codes, scale = quantize(w.reshape(-1, block).astype(np.float32), per_channel=True)
    values = VALUES[codes & 0x7F] * np.where(codes & 0x80, -1.0, 1.0)
    return (values * scale).reshape(rows, k)


def q8_0(w):
    rows, k = w.shape
    b = w.reshape(rows, k // 32, 32)
    d = np.abs(b).max(axis=-1, keepdims=True) / 127
    d[d == 0] = 1
    return (np.round(b / d) * d).reshape(rows, k)


FORMATS = {
    "e4m3, a scale per row": lambda w: e4m3_blocks(w, None),
    "e4m3, a scale per 128": lambda w: e4m3_blocks(w, 128),
    "e4m3, a scale per 32": lambda w: e4m3_blocks(w, 32),
    "Q8_0 (int8, a scale per 32)": q8_0,
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf")
    args = p.parse_args()
    sums = {name: [0.0, 0.0] for name in FORMATS}
    gauss = {name: [0.0, 0.0] for name in FORMATS}
    rng = np.random.default_rng(0)
    weights = 0
    for t in GGUFReader(args.gguf).tensors:
        if len(t.shape) != 2 or t.name == "token_embd.weight":
            continue
        k, rows = int(t.shape[0]), int(t.shape[1])
        if k % 128:
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float64).reshape(rows, k)
        g = rng.standard_normal(w.shape)
        weights += w.size
        for name, fmt in FORMATS.items():
            for acc, x in ((sums, w), (gauss, g)):
                acc[name][0] += float(((fmt(x) - x) ** 2).sum())
                acc[name][1] += float((x**2).sum())
    if weights == 0:
        sys.exit(f"{args.gguf}: no 2-D weights whose rows hold a multiple of 128 weights")
    print(f"{weights:,} weights of {args.gguf}")
    print(f"{'format':30s} {'this model':>11s} {'Gaussian':>9s}")
    for name in FORMATS:
        model = (sums[name][0] / sums[name][1]) ** 0.5
        normal = (gauss[name][0] / gauss[name][1]) ** 0.5
        print(f"{name:30s} {100 * model:10.3f}% {100 * normal:8.3f}%")


if __name__ == "__main__":
    main()
