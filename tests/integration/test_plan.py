"""`inferd plan`: the cuda memory plan of a config without a GPU, on the Llama-3-8B shape (a sparse
safetensors file: shapes without data) and an 80 GB GPU, in bf16, fp16, with `engine.quantization: fp8`, and each
of bf16 and fp8 with `engine.kv_cache_dtype: fp8_e4m3`."""
import json
import math
import os
import subprocess
import sys

from conftest import INFERD_BIN, SOURCE_DIR

H, I, L, NH, NKV, V, D = 4096, 14336, 32, 32, 8, 128256, 128


def plan(tmp_path, *args, env=None):
    model = tmp_path / "llama3-8b"
    subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "tools", "make_llama3_8b_random.py"), str(model),
                    "--sparse"], check=True, capture_output=True)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {model}}}\nscheduler: {{max_num_seqs: 256, max_num_batched_tokens: 8192}}\n")
    return subprocess.run([INFERD_BIN, "plan", "--config", str(cfg), *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_llama3_8b_bf16_on_an_80_gb_gpu(tmp_path):
    r = plan(tmp_path, "--gpu-memory-gib", "80", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    budget = int(80 * 2**30 * 0.9)
    assert out["budget_bytes"] == budget
    params = V * H * 2 + H + L * (2 * H + (NH + 2 * NKV) * D * H + H * NH * D + 3 * I * H)
    assert params == 8_030_261_248
    Tn, R = 8192, 256
    LR = 2 * R  # logits rows: a sampled row per sequence and as many prompt rows (output.prompt_logprobs)

    def aligned(n):
        return (n + 255) // 256 * 256

    # The activation arena, region by region (each 256-byte aligned), then cuBLASLt's 32 MiB workspace.
    outputs = 2 * aligned(4 * LR) + 2 * aligned(4 * LR * 20)  # sampled ids, logprobs, 20 alternatives of each
    # Each sequence's context, 256 stop ids, the model's one eos id and 300 logit_bias ids.
    max_penalties = R * (8192 + 256 + 1 + 300)
    regions = [2 * Tn * H] * 3 + [2 * Tn * (NH + 2 * NKV) * D, 2 * Tn * NH * D, 2 * Tn * 2 * I, 2 * Tn * I] \
        + [2 * LR * H] + [4 * LR * V, 3 * 4 * (D // 2), 128 << 20, 8 << 20, outputs, 4 * max_penalties]
    activations = sum(aligned(n) for n in regions) + (32 << 20)
    # engine.quantization fp8: the layers' linear weights one byte an element and a fp32 scale per output row;
    # the products' e4m3 inputs [Tn, max(H, NH * D, I)] and their per-token scales in the activation arena.
    linear = L * ((NH + 2 * NKV) * D * H + H * NH * D + 3 * I * H)
    linear_rows = L * ((NH + 2 * NKV) * D + H + 2 * I + H)
    fp8_weights = 2 * params - linear + 4 * linear_rows
    fp8_activations = activations + aligned(Tn * max(H, NH * D, I)) + aligned(4 * Tn)
    assert [p["dtype"] for p in out["plans"]] == ["bfloat16", "float16", "fp8", "bf16+kv8", "fp8+kv8"]
    for p in out["plans"]:
        fp8 = p["dtype"].startswith("fp8")
        kv8 = p["dtype"].endswith("+kv8")
        assert p["kv_cache_dtype"] == ("fp8_e4m3" if kv8 else "auto")
        assert p["weight_bytes"] == (fp8_weights if fp8 else 2 * params)  # 8665.8 / 15316.5 MiB
        assert p["activation_bytes"] == (fp8_activations if fp8 else activations)  # 1567.2 / 1455.1 MiB
        block = 2 * L * 16 * NKV * D * (1 if kv8 else 2)
        assert p["kv_bytes_per_block"] == block == (1 << 20 if kv8 else 2 << 20)  # 64 or 128 KiB per token
        assert p["num_blocks"] == (budget - p["weight_bytes"] - p["activation_bytes"] - p["other_bytes"]) // block
        low, high = (31_000, 32_500) if fp8 else (28_000, 29_000)
        if kv8:
            low, high = 2 * low, 2 * high  # an fp8 KV cache holds twice the tokens
        assert low < p["num_blocks"] < high, p
        assert p["sequences_at_4096"] == p["num_blocks"] // 256
    table = plan(tmp_path, "--gpu-memory-gib", "80")
    assert "15316.5" in table.stdout and f"{activations / 2**20:.1f}" in table.stdout and "131072" in table.stdout
    assert "8665.8" in table.stdout and f"{fp8_activations / 2**20:.1f}" in table.stdout and "65536" in table.stdout


def test_without_a_gpu_it_asks_for_the_memory(tmp_path):
    r = plan(tmp_path, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # no GPU visible, on any machine
    assert r.returncode == 2, r.stdout
    assert "no GPU is visible; give its free memory with --gpu-memory-gib N" in r.stderr


def plan_table(cfg):
    r = subprocess.run([INFERD_BIN, "plan", "--config", str(cfg), "--gpu-memory-gib", "1"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_mixture_of_experts_is_planned_with_every_expert_in_bf16_and_fp8(tmp_path):
    model = os.path.join(SOURCE_DIR, "tests/fixtures/models/mixtral-tiny")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {model}}}\n")
    r = subprocess.run([INFERD_BIN, "plan", "--config", str(cfg), "--gpu-memory-gib", "1", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    plans = json.loads(r.stdout)["plans"]
    assert [p["dtype"] for p in plans] == ["bfloat16", "float16", "fp8"]
    with open(os.path.join(model, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    header.pop("__metadata__", None)
    elements = sum(math.prod(t["shape"]) for t in header.values())
    # Its heads of 16 run padded to 64 (the attention kernels' narrowest): q/k/v rows and o columns grow.
    c = json.load(open(os.path.join(model, "config.json")))
    hd = c["hidden_size"] // c["num_attention_heads"]
    padded_rows = c["num_hidden_layers"] * (64 - hd) * (c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    padding = padded_rows * c["hidden_size"] + c["num_hidden_layers"] * (64 - hd) * c["num_attention_heads"] \
        * c["hidden_size"]
    # Every tensor of the checkpoint on the GPU in 2 bytes an element: the router and every expert included.
    assert plans[0]["weight_bytes"] == 2 * (elements + padding)
    # fp8: the attention products and every expert's in one byte an element and a 4-byte scale per output row; the
    # router (its logits choose the experts), norms, embeddings and LM head in 2 bytes.
    products = ("q_proj", "k_proj", "v_proj", "o_proj", ".w1.", ".w2.", ".w3.")
    fp8 = 0
    for name, t in header.items():
        n = math.prod(t["shape"])
        fp8 += n + 4 * t["shape"][0] if ".layers." in name and any(p in name for p in products) else 2 * n
    assert plans[2]["weight_bytes"] == fp8 + padding + 4 * padded_rows


def test_an_fp8_checkpoint_is_planned_as_fp8_only(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {os.path.join(SOURCE_DIR, 'tests/fixtures/models/llama3-tiny-fp8')}}}\n")
    r = subprocess.run([INFERD_BIN, "plan", "--config", str(cfg), "--gpu-memory-gib", "1", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    plans = json.loads(r.stdout)["plans"]
    assert [p["dtype"] for p in plans] == ["fp8"]
    # llama3-tiny: 2 layers of q 64x64, k and v 32x64, o 64x64, gate and up 160x64, down 64x160 at one byte
    # and a fp32 scale per row; the embedding and LM head (640x64, untied), two norms of 64 a layer and the final
    # one in bf16. Its heads of 16 run padded to 64 on cuda (engine/model/head_padding.h): q, k and v have 4 times
    # the rows, o 4 times the columns.
    assert "head_dim 16 (run padded to 64" in plan_table(cfg)
    linear = 2 * (4 * 64 * 64 + 4 * 2 * 32 * 64 + 4 * 64 * 64 + 3 * 160 * 64)
    rows = 2 * (4 * 64 + 4 * 2 * 32 + 64 + 2 * 160 + 64)
    other = 2 * (2 * 640 * 64 + 64 + 2 * 2 * 64)
    assert plans[0]["weight_bytes"] == linear + 4 * rows + other


def test_tensor_parallel_sizes_that_fit_llama3_70b_on_80_gb_gpus(tmp_path):
    # 70.6 B parameters: 141 GB in bf16 does not fit one 80 GB GPU; split over 2 each holds half of every layer's
    # products (whole embeddings, LM head and norms) and half of the KV heads.
    model = tmp_path / "llama3-70b"
    subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "tools", "make_llama3_8b_random.py"), str(model),
                    "--sparse", "--70b"], check=True, capture_output=True)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{path: {model}}}\nscheduler: {{max_num_seqs: 64, max_num_batched_tokens: 4096}}\n")
    run = lambda *a: subprocess.run([INFERD_BIN, "plan", "--config", str(cfg), "--gpu-memory-gib", "80", *a],
                                    capture_output=True, text=True, timeout=60)
    r = run("--tensor-parallel", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["tensor_parallel_size"] == 2
    h, i, l, nh, nkv = 8192, 28672, 80, 64, 8
    products = l * ((nh + 2 * nkv) * D * h + h * nh * D + 3 * i * h)
    assert out["plans"][0]["weight_bytes"] == 2 * (2 * V * h + h + l * 2 * h + products // 2)
    assert out["plans"][0]["kv_bytes_per_block"] == 2 * l * 16 * (nkv // 2) * D * 2
    fits = {f["tensor_parallel_size"]: f["fits"] for f in out["tensor_parallel_fits"]}
    assert fits == {1: False, 2: True, 4: True, 8: True}
    text = run("--tensor-parallel", "4").stdout
    assert "each of 4 GPUs" in text and "1: weights 131.4 GiB a GPU" in text and "does not fit" in text
    bad = run("--tensor-parallel", "3")
    assert bad.returncode == 2 and "1, 2, 4 or 8" in bad.stderr


def test_a_named_gpu_is_planned_with_its_datasheet_memory_and_ceilings(tmp_path):
    """--device NAME: the plan of a GPU one does not have, from the table of known ones: its memory less the driver's
    share, no fp8 plan where it has no fp8 tensor cores, and the datasheet's decode and prefill ceilings."""
    h100 = plan(tmp_path, "--device", "h100-sxm", "--json")
    assert h100.returncode == 0, h100.stderr
    out = json.loads(h100.stdout)
    assert out["device_free_bytes"] == int(79.6 * 2**30) - 512 * 2**20
    d = out["device"]
    assert d["name"] == "H100-SXM" and d["bandwidth_bytes_per_s"] == 3350e9
    # Batch-1 decode reads every weight but the embedding table once (the LM head included), and the context's K/V:
    # 15.1 GB at 3.35 TB/s is ~221 tokens/s at most.
    weights = next(p["weight_bytes"] for p in out["plans"] if p["dtype"] == "bfloat16")
    read = weights - V * H * 2 + 1024 * 2 * L * NKV * D * 2
    assert 0.99 < d["decode_batch1_tokens_per_s_ceiling"] * read / 3350e9 < 1.01
    assert 50_000 < d["prefill_4096_tokens_per_s_ceiling"] < 80_000  # ~15 GFLOP a token and attention at 989 TFLOP/s
    a10 = json.loads(plan(tmp_path, "--device", "A10", "--json").stdout)
    assert {p["dtype"] for p in a10["plans"]} == {"bfloat16", "float16", "bf16+kv8"}  # no fp8 tensor cores
    assert a10["plans"][0]["num_blocks"] < out["plans"][0]["num_blocks"]
    bad = plan(tmp_path, "--device", "H900")
    assert bad.returncode == 2 and "'H900' is not known" in bad.stderr and "H100-SXM" in bad.stderr
    both = plan(tmp_path, "--device", "A10", "--gpu-memory-gib", "20")
    assert both.returncode == 2 and "usage" in both.stderr
