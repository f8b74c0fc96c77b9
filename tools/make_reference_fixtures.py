#!/usr/bin/env python3
"""Records Hugging Face transformers' greedy tokens and top logprobs for the test models.

Runs where torch + transformers are installed (the GPU machine; it computes on the CPU in fp32, eager
attention, so the reference is exact fp32 math rather than TF32):

    python3 tools/make_reference_fixtures.py tests/fixtures/models tests/fixtures/reference

and for a GGUF model (transformers dequantizes it to fp32 with the `gguf` package; the prompts add a chat
turn rendered with the model's template):

    python3 tools/make_reference_fixtures.py --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf smollm2-135m-instruct \
        --skip-dir tests/fixtures/models tests/fixtures/reference

With --fp8-weights (suffix -fp8), each linear layer's weight (and each expert's) is first replaced by its fp8
dequantization as `engine.quantization: fp8` makes it (bf16, then e4m3 with one fp32 scale per output row, bit for
bit), so the reference is the fp8 model in fp32 arithmetic. --fp8-activations (suffix -fp8a8) also rounds each of those
layers' inputs per token to e4m3 (scale = max |row| / 448), as the engine does for steps of more than a few rows;
with --fp8-activation-shards N (suffix -fp8a8-tpN) the attention output and down products' inputs per 1/N of each
row, as N tensor-parallel ranks quantize their own slices.

Each file holds, per prompt: the prompt ids, 32 greedy tokens, and for every step the top-5 (id, logprob)
and the margin between the two largest logits (tests skip positions where it is below 1e-2).
"""
import argparse
import json
import os
import random

import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The scheduler batches tokens",
    "Hello world",
    "def forward(self, x):\n    return",
    "日本語のテキスト 😀",
    " ".join(["the model serves requests over a paged cache of blocks"] * 8),  # > 64 tokens: several blocks
]
NEW_TOKENS = 32
TOP = 5
# For the large-activation GPU models (names ending in "-sharp"): prompts of ~760 and ~3,000 tokens, many blocks
# and several prefill chunks, cut to these lengths after tokenizing.
LONG_PROMPT_TOKENS = [759, 3000]


def long_prompt_text(seed):
    words = ("the model serves requests over a paged cache of blocks while the scheduler batches tokens every "
             "step and the engine samples the next token attention layers norm rotary weights 12 345").split()
    rng = random.Random(seed)
    return " ".join(rng.choice(words) for _ in range(4000))


def fp8_rows(w):
    """w (rows along the last dimension, any leading ones) through the engine's fp8 quantization: rounded to bf16,
    scale = max |row| / 448 (1 for a row of zeros), e4m3 = round-to-nearest-even of row / scale, saturating; then
    back to w's dtype."""
    v = w.to(torch.bfloat16).to(torch.float32)
    amax = v.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (v / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return (q.to(torch.float32) * scale).to(w.dtype)


def experts_modules(model):
    """The mixtures' experts (transformers 5 stacks them: gate_up_proj [experts, 2 · inter, hidden], gate rows then
    up rows, and down_proj [experts, hidden, inter]); their routers (`.gate`) are not nn.Linear and stay as they are,
    as the engine keeps them."""
    for name, module in model.named_modules():
        if ".layers." in f".{name}" and isinstance(getattr(module, "gate_up_proj", None), torch.nn.Parameter):
            yield module


@torch.no_grad()
def dequantize_fp8_weights(model):
    """Each layer's linear weights, and each expert's, through the engine's fp8 quantization (per output row)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}":
            module.weight.data = fp8_rows(module.weight.data)
    for module in experts_modules(model):
        module.gate_up_proj.data = fp8_rows(module.gate_up_proj.data)
        module.down_proj.data = fp8_rows(module.down_proj.data)


def round_fp8_per_token(x):
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (x / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.to(x.dtype) * scale


# The row-parallel products of a model split over ranks (engine/model/tensor_parallel.h): each rank holds a
# contiguous 1/N of their inputs' columns and quantizes its own slice per token.
ROW_PARALLEL = ("o_proj", "down_proj")


def quantize_fp8_inputs(model, shards=1):
    """Each layer's linear inputs rounded per token (row) through e4m3 with scale max |row| / 448; with shards > 1,
    the row-parallel products' inputs per token and per 1/shards of the row, as tensor_parallel_size = shards runs."""
    def hook(module, args):
        return (round_fp8_per_token(args[0]),) + tuple(args[1:])

    def sharded_hook(module, args):
        parts = torch.chunk(args[0], shards, dim=-1)
        return (torch.cat([round_fp8_per_token(p) for p in parts], dim=-1),) + tuple(args[1:])

    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in f".{name}":
            row_parallel = shards > 1 and name.endswith(ROW_PARALLEL)
            module.register_forward_pre_hook(sharded_hook if row_parallel else hook)
    for module in experts_modules(model):
        module.forward = fp8_experts_forward(module, shards)


def fp8_experts_forward(experts, shards):
    """The experts' forward of transformers 5 with each product's input rounded per row through e4m3, as the
    engine's grouped fp8 path quantizes them (kernels/moe_fp8.h): each token's row before gate/up, each slot's
    SiLU·mul row (per 1/shards of it: each rank quantizes its own columns) before down."""
    def forward(hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        x = round_fp8_per_token(hidden_states)
        for e in range(experts.gate_up_proj.shape[0]):
            token_idx, pos = torch.where(top_k_index == e)
            if token_idx.numel() == 0:
                continue
            gate, up = torch.nn.functional.linear(x[token_idx], experts.gate_up_proj[e]).chunk(2, dim=-1)
            act = experts.act_fn(gate) * up
            act = torch.cat([round_fp8_per_token(p) for p in torch.chunk(act, shards, dim=-1)], dim=-1)
            y = torch.nn.functional.linear(act, experts.down_proj[e]) * top_k_weights[token_idx, pos, None]
            out.index_add_(0, token_idx, y.to(out.dtype))
        return out
    return forward


@torch.no_grad()
def greedy(model, prompt_ids):
    """Greedy decoding with the model's KV cache, as generate() runs it."""
    ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)
    steps = []
    past = None
    for _ in range(NEW_TOKENS):
        out = model(ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[0, -1].to(torch.float32)
        logprobs = torch.log_softmax(logits, dim=-1)
        top = torch.topk(logits, TOP)
        token = int(top.indices[0])
        steps.append({
            "token": token,
            "top": [[int(i), float(logprobs[i])] for i in top.indices],
            "margin": float(top.values[0] - top.values[1]),
        })
        ids = torch.tensor([[token]], device=model.device)
    return steps


@torch.no_grad()
def forced(model, prompt_ids, tokens):
    """The model's top-5 and margin at each generated position when the context is another run's tokens (teacher
    forcing): how this run's arithmetic alone, not its own earlier choices, moves each position."""
    ids = torch.tensor([prompt_ids + tokens[:-1]], dtype=torch.long, device=model.device)
    logits = model(ids).logits[0, len(prompt_ids) - 1:].to(torch.float32)
    steps = []
    for row in logits:
        logprobs = torch.log_softmax(row, dim=-1)
        top = torch.topk(row, TOP)
        steps.append({"token": int(top.indices[0]), "top": [[int(i), float(logprobs[i])] for i in top.indices],
                      "margin": float(top.values[0] - top.values[1])})
    return steps


def record(model, encode, name, out_dir, command, prompts, cut=None, forced_on=None):
    """forced_on: another reference of the same prompts; each case then also holds this model's steps along its
    tokens ("forced")."""
    cases = []
    for i, text in enumerate(prompts):
        prompt_ids = encode(text)
        if cut and i < len(cut) and cut[i]:
            prompt_ids = prompt_ids[:cut[i]]
        cases.append({"text": text, "prompt_ids": prompt_ids, "steps": greedy(model, prompt_ids)})
        if forced_on:
            other = forced_on["cases"][i]
            assert other["prompt_ids"] == prompt_ids, "the forced-on reference has the same prompts"
            cases[-1]["forced"] = forced(model, prompt_ids, [s["token"] for s in other["steps"]])
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump({"model": name, "transformers": transformers.__version__, "torch": torch.__version__,
                   "command": command, "cases": cases}, f, indent=1, ensure_ascii=False)
    small = sum(s["margin"] < 1e-2 for c in cases for s in c["steps"])
    print(f"{name}: {len(cases)} prompts, {small} steps with margin < 1e-2", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("models_dir")
    p.add_argument("out_dir")
    p.add_argument("--gguf", nargs=2, action="append", default=[], metavar=("FILE", "NAME"))
    p.add_argument("--skip-dir", action="store_true", help="only the --gguf models")
    p.add_argument("--only", action="append", default=[], help="only these models of models_dir (repeatable)")
    p.add_argument("--device", default="cpu", help="cpu (exact fp32) or cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--suffix", default="", help="appended to each reference's file name")
    p.add_argument("--fp8-weights", action="store_true",
                   help="linear weights dequantized from the engine's fp8 (without --fp8-activations the -sharp "
                        "models are left out)")
    p.add_argument("--fp8-activations", action="store_true",
                   help="with --fp8-weights: the linear layers' inputs rounded per token to e4m3 too")
    p.add_argument("--fp8-activation-shards", type=int, default=1, metavar="N",
                   help="with --fp8-activations: the attention output and down products' inputs rounded per token "
                        "and per 1/N of the row, as engine.tensor_parallel_size N quantizes them")
    p.add_argument("--forced-on-fp32", action="store_true",
                   help="for the -sharp models, also record steps along the fp32 reference's tokens in out_dir")
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.manual_seed(0)
    for name in [] if args.skip_dir else sorted(os.listdir(args.models_dir)):
        d = os.path.join(args.models_dir, name)
        # The -sharp models get fp8 references only with the inputs rounded too (-fp8a8, what the parity runs use).
        if not os.path.exists(os.path.join(d, "config.json")) or (
                args.fp8_weights and not args.fp8_activations and name.endswith("-sharp")):
            continue
        if name.endswith("-fp8") or (args.only and name not in args.only):  # -fp8: tools/make_fp8_checkpoint.py's
            continue
        model, info = AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, args.dtype),
                                                           attn_implementation="eager", output_loading_info=True)
        # Every weight from the files, none left at its random initialisation (a family whose names transformers
        # maps differently would otherwise give a reference of another model).
        unread = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
        assert not unread, f"{name}: {unread}"
        model = model.to(args.device)
        model.eval()
        if args.fp8_weights:
            dequantize_fp8_weights(model)
        if args.fp8_activations:
            quantize_fp8_inputs(model, args.fp8_activation_shards)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        command = "python3 tools/make_reference_fixtures.py tests/fixtures/models tests/fixtures/reference"
        if args.device != "cpu" or args.dtype != "float32" or args.fp8_weights:
            command = (f"python3 tools/make_reference_fixtures.py --device {args.device} --dtype {args.dtype} "
                       f"--suffix '{args.suffix}'{' --fp8-weights' if args.fp8_weights else ''}"
                       f"{' --fp8-activations' if args.fp8_activations else ''}"
                       f"{f' --fp8-activation-shards {args.fp8_activation_shards}' if args.fp8_activation_shards > 1 else ''} "
                       f"{args.models_dir} {args.out_dir}")
        prompts, cut = PROMPTS, None
        # The large-activation models and the mixtures of experts (whose bf16 runs may route a row to another
        # expert) get long prompts too, and bf16 references along fp32's tokens (the parity suite's SharpParity).
        forced_kind = name.endswith("-sharp") or "-moe" in name or name.startswith("mixtral")
        if forced_kind:
            prompts = PROMPTS + [long_prompt_text(n) for n in LONG_PROMPT_TOKENS]
            cut = [None] * len(PROMPTS) + LONG_PROMPT_TOKENS
        forced_on = None
        if forced_kind and args.forced_on_fp32:
            with open(os.path.join(args.out_dir, f"{name}.json")) as f:
                forced_on = json.load(f)
            command += " --forced-on-fp32"
        record(model, lambda t: tok.encode(t, add_special_tokens=True).ids, name + args.suffix, args.out_dir,
               command, prompts, cut, forced_on)
    for path, name in args.gguf:
        d, f = os.path.split(os.path.abspath(path))
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()
        tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
        command = (f"python3 tools/make_reference_fixtures.py --gguf {path} {name} --skip-dir tests/fixtures/models "
                   "tests/fixtures/reference")
        if tok.chat_template is None:  # a base model: the prompts as text after the file's BOS
            record(model, lambda t: tok(t, add_special_tokens=True)["input_ids"], name, args.out_dir,
                   command + " (add_special_tokens)", PROMPTS + ["The capital of France is"])
            continue
        chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                       tokenize=False, add_generation_prompt=True)
        record(model, lambda t: tok(t, add_special_tokens=False)["input_ids"], name, args.out_dir, command,
               PROMPTS + [chat])


if __name__ == "__main__":
    main()
