#!/usr/bin/env python3
"""Writes the committed seed corpus of the fuzz targets (tests/fuzz/corpus): small well-formed GGUF and
safetensors files, and the hostile cases the readers must refuse (kept as regression seeds).

    .venv/bin/python tools/make_fuzz_corpus.py tests/fuzz/corpus
"""
import json
import os
import struct
import sys

import gguf
import numpy as np


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def header(n_tensors, n_kv, version=3):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def pad(b, align=32):
    return b + b"\0" * (-len(b) % align)


def tensor_info(name, dims, ggml_type, offset):
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ggml_type, offset)


def gguf_cases(out):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "tiny_model.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_token_list(["<s>", "</s>", "a", "b", "ab"])
    w.add_token_scores([0.0, 0.0, -1.0, -2.0, -0.5])
    w.add_token_types([3, 3, 1, 1, 1])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_float64("test.f64", 2.5)
    w.add_bool("test.bool", True)
    w.add_int64("test.i64", -7)
    for name, qtype, cols in (("q8", gguf.GGMLQuantizationType.Q8_0, 34), ("q4k", gguf.GGMLQuantizationType.Q4_K, 144),
                              ("q6k", gguf.GGMLQuantizationType.Q6_K, 210), ("q41", gguf.GGMLQuantizationType.Q4_1, 20)):
        w.add_tensor(name, np.full((1, cols), 17, dtype=np.uint8), raw_dtype=qtype)
    w.add_tensor("f", np.arange(6, dtype=np.float16).reshape(2, 3), raw_dtype=gguf.GGMLQuantizationType.F16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cases = {
        "dims_overflow": header(1, 0) + tensor_info("t", [1 << 40, 1 << 40], 0, 0),
        "string_length_2_63": header(0, 1) + struct.pack("<Q", 1 << 63) + b"\0" * 64,
        "string_past_eof": header(0, 1) + s("k") + struct.pack("<IQ", 8, 100) + b"abc",
        "array_2_63": header(0, 1) + s("k") + struct.pack("<IIQ", 9, 0, 1 << 63),
        "type_mismatch": header(0, 2) + s("general.architecture") + struct.pack("<I", 8) + s("llama") +
        s("llama.block_count") + struct.pack("<I", 8) + s("thirty"),
        "offset_out_of_range": pad(header(1, 0) + tensor_info("t", [8], 0, 64)) + b"\0" * 32,
        "overlapping": pad(header(2, 0) + tensor_info("a", [16], 0, 0) + tensor_info("b", [16], 0, 32)) + b"\0" * 128,
        "misaligned": pad(header(1, 0) + tensor_info("t", [8], 0, 4)) + b"\0" * 64,
        "version_2_ok": pad(header(1, 1, version=2) + s("general.alignment") + struct.pack("<II", 4, 64) +
                            tensor_info("t", [4], 0, 0), 64) + b"\0" * 16,
    }
    for name, data in cases.items():
        with open(os.path.join(out, name + ".gguf"), "wb") as f:
            f.write(data)


def st(header_obj, data=b"", header_len=None):
    h = json.dumps(header_obj).encode() if not isinstance(header_obj, bytes) else header_obj
    return struct.pack("<Q", len(h) if header_len is None else header_len) + h + data


def safetensors_cases(out):
    os.makedirs(out, exist_ok=True)
    ok = {"__metadata__": {"format": "pt"},
          "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}
    cases = {
        "valid": st(ok, bytes(range(22))),
        "overlapping": st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                           "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12),
        "huge_header_length": st({}, b"", header_len=1 << 62),
        "dim_overflow": st({"a": {"dtype": "F32", "shape": [1 << 32, 1 << 32], "data_offsets": [0, 0]}}),
        "not_json": st(b"{nope"),
        "deep_json": st(b"[" * 2000 + b"]" * 2000),
    }
    for name, data in cases.items():
        with open(os.path.join(out, name + ".safetensors"), "wb") as f:
            f.write(data)


def main():
    out = sys.argv[1]
    gguf_cases(os.path.join(out, "gguf"))
    safetensors_cases(os.path.join(out, "safetensors"))


if __name__ == "__main__":
    main()
