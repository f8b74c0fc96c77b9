"""Both CUDA streams of a cuda server's run, from its log with engine.profile_steps on: each step's compute and each
KV copy batch on the copy stream, on one device clock (CUDA events). Prints

  - the step with the most copy time under it, drawn beside the copy stream, with the intervals in numbers;
  - where the copy stream's time went: under a step's compute, or while the compute stream was idle, and how long
    steps waited for a copy;
  - steps with copies under them against steps of the same shape (sequences, tokens) without: how much longer the
    former took, as a share of the copy time under them (0: the copies cost the step nothing; 1: the step got
    longer by the whole copy time, as if the copies ran on its stream).

    python3 tests/gpu/copy_timeline.py LOG [--json FILE]

Exits 1 when the log holds no copy that ran under a step (nothing to show).
"""
import argparse
import json
import re
import statistics
import sys

STEP = re.compile(r"step (\d+): (\d+) seqs, (\d+) tokens: .*GPU compute ([\d.]+) ms.*device clock "
                  r"(-?[\d.]+)-(-?[\d.]+) ms")
COPIES = re.compile(r"copies (\d+): (\d+) blocks out, (\d+) in: device clock ([\d.]+)-([\d.]+) ms, a step waited "
                    r"([\d.]+) ms")


def parse(path):
    steps, batches = [], []
    with open(path) as f:
        for line in f:
            if m := STEP.search(line):
                n, seqs, tokens, _, a, b = m.groups()
                if float(a) >= 0:
                    steps.append({"step": int(n), "seqs": int(seqs), "tokens": int(tokens), "start": float(a),
                                  "end": float(b)})
            elif m := COPIES.search(line):
                t, out, inn, a, b, w = m.groups()
                batches.append({"ticket": int(t), "out": int(out), "in": int(inn), "start": float(a),
                                "end": float(b), "waited": float(w)})
    steps.sort(key=lambda s: s["start"])
    batches.sort(key=lambda b: b["start"])
    return steps, batches


def overlap(a, b):
    return max(0.0, min(a["end"], b["end"]) - max(a["start"], b["start"]))


def draw(step, steps, batches, width=72):
    lo, hi = step["start"] - 0.25 * (step["end"] - step["start"]), step["end"] + 0.25 * (step["end"] - step["start"])
    scale = width / (hi - lo)

    def row(intervals, marks):
        cells = [" "] * width
        for k, iv in enumerate(intervals):
            a, b = max(lo, iv["start"]), min(hi, iv["end"])
            if b <= a:
                continue
            for c in range(int((a - lo) * scale), max(int((a - lo) * scale) + 1, int((b - lo) * scale))):
                if c < width:
                    cells[c] = marks(k, iv)
        return "".join(cells)

    near = [s for s in steps if s["end"] > lo and s["start"] < hi]
    copies = [b for b in batches if b["end"] > lo and b["start"] < hi]
    print(f"  {lo:.3f} ms {'':>{width - 22}} {hi:.3f} ms")
    print(f"  |{row(near, lambda k, s: '#' if s is step else '=')}|  compute (# the step, = its neighbours)")
    print(f"  |{row(copies, lambda k, b: '>' if b['in'] == 0 else ('<' if b['out'] == 0 else 'x'))}|"
          "  copy stream (> out, < in, x both)")
    for s in near:
        print(f"    step {s['step']:>6}: {s['seqs']:>3} seqs, {s['tokens']:>5} tokens, compute {s['start']:.3f}-"
              f"{s['end']:.3f} ms ({s['end'] - s['start']:.3f} ms)")
    for b in copies:
        print(f"    copies {b['ticket']:>5}: {b['out']:>3} blocks out, {b['in']:>3} in, {b['start']:.3f}-{b['end']:.3f} ms "
              f"({b['end'] - b['start']:.3f} ms, {overlap(b, step):.3f} ms under step {step['step']}), "
              f"a step waited {b['waited']:.3f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--json")
    args = ap.parse_args()
    steps, batches = parse(args.log)
    print(f"{len(steps)} steps and {len(batches)} copy batches on the device clock")
    # Copy time under each step (steps do not overlap one another: one stream).
    j = 0
    for s in steps:
        s["copy_under"] = 0.0
        while j < len(batches) and batches[j]["end"] <= s["start"]:
            j += 1
        k = j
        while k < len(batches) and batches[k]["start"] < s["end"]:
            s["copy_under"] += overlap(s, batches[k])
            k += 1
    busy = sum(b["end"] - b["start"] for b in batches)
    under = sum(s["copy_under"] for s in steps)
    waited = sum(b["waited"] for b in batches)
    with_copies = [s for s in steps if s["copy_under"] > 0]
    if not with_copies:
        print("no copy ran under a step: nothing to show")
        return 1
    print("\nthe step with the most copy time under it:")
    draw(max(with_copies, key=lambda s: s["copy_under"]), steps, batches)
    print(f"\ncopy stream busy {busy:.1f} ms: {under:.1f} ms under a step's compute ({100 * under / busy:.1f} %), "
          f"{busy - under:.1f} ms while the compute stream was idle; steps waited {waited:.1f} ms for copies "
          f"({100 * waited / busy:.1f} % of the copy time)")
    # Same-shape comparison: median compute of steps with copies under them against those without.
    shapes = {}
    for s in steps:
        shapes.setdefault((s["seqs"], s["tokens"]), ([], []))[s["copy_under"] > 0].append(s)
    longer, copy_under, base_total, compared = 0.0, 0.0, 0.0, 0
    for (seqs, tokens), (without, with_) in shapes.items():
        if len(without) < 3 or not with_:
            continue
        base = statistics.median(s["end"] - s["start"] for s in without)
        for s in with_:
            longer += (s["end"] - s["start"]) - base
            copy_under += s["copy_under"]
            base_total += base
            compared += 1
    result = {"steps": len(steps), "copy_batches": len(batches), "copy_busy_ms": busy, "copy_under_compute_ms": under,
              "copy_waited_ms": waited, "steps_with_copies": len(with_copies), "steps_compared": compared}
    if compared:
        share = longer / copy_under if copy_under > 0 else 0.0
        print(f"{compared} of {len(with_copies)} steps with copies under them have a shape also seen without "
              f"(3 or more times): together {longer:+.1f} ms against those shapes' medians, while {copy_under:.1f} ms "
              f"of copies ran under them: the steps got longer by {100 * share:.1f} % of the copy time "
              f"({longer / compared:+.3f} ms a step, {100 * longer / base_total:+.1f} % of their shapes' median)")
        result.update({"steps_longer_ms": longer, "copy_under_compared_ms": copy_under, "longer_share": share,
                       "steps_longer_relative": longer / base_total})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
