"""tests/gpu/copy_timeline.py on a made-up profiled log: its sums of copy time under compute, idle and waited, and
its same-shape comparison, against values worked out by hand."""
import json
import os
import subprocess
import sys

from conftest import SOURCE_DIR

SCRIPT = os.path.join(SOURCE_DIR, "tests", "gpu", "copy_timeline.py")
STEP = ("[info] step {n}: {seqs} seqs, {tokens} tokens: schedule 0.010 ms, prepare and launch 0.100 ms (pack, copy, "
        "plan, enqueue), GPU compute {ms:.3f} ms, GPU idle before it 0.000 ms, host waiting for its tokens 1.000 ms, "
        "outputs 0.010 ms; device clock {a:.3f}-{b:.3f} ms")
COPIES = "[info] copies {t}: {out} blocks out, {inn} in: device clock {a:.3f}-{b:.3f} ms, a step waited {w:.3f} ms"


def run(tmp_path, lines):
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / "timeline.json"
    p = subprocess.run([sys.executable, SCRIPT, str(log), "--json", str(out)], capture_output=True, text=True)
    return p, (json.loads(out.read_text()) if out.exists() else None)


def test_copy_time_under_steps_idle_and_waited_and_the_same_shape_comparison(tmp_path):
    lines = []
    # Four decode steps of 8 seqs, 10 ms each, 1 ms apart: 0-10, 11-21, 22-32, 33-43. The third is 1 ms longer.
    for n, (a, b) in enumerate([(0, 10), (11, 21), (22, 33), (34, 44)]):
        lines.append(STEP.format(n=n + 1, seqs=8, tokens=8, ms=b - a, a=a, b=b))
    # One batch from 23 to 35: 10 ms under step 3, 1 ms in the gap, 1 ms under step 4; a step waited 0.5 ms.
    lines.append(COPIES.format(t=1, out=4, inn=2, a=23, b=35, w=0.5))
    p, r = run(tmp_path, lines)
    assert p.returncode == 0, p.stdout + p.stderr
    assert r["steps"] == 4 and r["copy_batches"] == 1
    assert abs(r["copy_busy_ms"] - 12) < 1e-6 and abs(r["copy_under_compute_ms"] - 11) < 1e-6
    assert abs(r["copy_waited_ms"] - 0.5) < 1e-6
    # Steps 3 and 4 have copies under them (11 and 10 ms long); shapes without: steps 1 and 2 only, fewer than 3, so
    # nothing is compared.
    assert r["steps_with_copies"] == 2 and r["steps_compared"] == 0
    # Three more plain steps of the shape: now the baseline's median is 10 ms, and steps 3 and 4 took +1 and +0 ms
    # while 11 ms of copies ran under them.
    for n, a in enumerate([50, 61, 72]):
        lines.append(STEP.format(n=10 + n, seqs=8, tokens=8, ms=10, a=a, b=a + 10))
    p, r = run(tmp_path, lines)
    assert r["steps_compared"] == 2
    assert abs(r["steps_longer_ms"] - 1) < 1e-6 and abs(r["longer_share"] - 1 / 11) < 1e-6
    assert abs(r["steps_longer_relative"] - 1 / 20) < 1e-6
    assert "step      3" in p.stdout, "the step with the most copy time under it is drawn"


def test_a_log_without_copies_under_steps_fails(tmp_path):
    p, _ = run(tmp_path, [STEP.format(n=1, seqs=1, tokens=1, ms=5, a=0, b=5),
                          COPIES.format(t=1, out=1, inn=0, a=6, b=7, w=0)])
    assert p.returncode == 1 and "nothing to show" in p.stdout
