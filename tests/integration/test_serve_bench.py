"""`inferd-bench serve` against the real server: a run at a Poisson rate, one all at once with a concurrency
cap, a JSONL dataset of prompts and chat messages, and a sweep written as CSV and drawn as PNG."""
import csv
import json
import os
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR, Server

BENCH = os.environ.get("INFERD_BENCH", os.path.join(SOURCE_DIR, "build", "tools", "inferd-bench"))
FIELDS = ["request_rate", "burstiness", "max_concurrency", "completed", "failed", "duration_s", "total_input_tokens",
          "total_output_tokens", "request_throughput", "input_throughput", "output_throughput",
          "total_token_throughput", "goodput", "slo_ms", "ttft", "tpot", "itl", "e2el", "model"]


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    assert s.stop() == 0


def bench(server, *args):
    return subprocess.run([BENCH, "serve", "--address", server.address, *args], capture_output=True, text=True,
                          timeout=300)


def test_a_poisson_run_reports_every_field_with_vllm_definitions(server, tmp_path):
    out = tmp_path / "r.json"
    r = bench(server, "--num-prompts", "30", "--request-rate", "40", "--burstiness", "0.5", "--random-input-len",
              "48", "--random-output-len", "12", "--random-range-ratio", "0.5", "--goodput", "ttft:600000,tpot:600000",
              "--seed", "3", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert set(FIELDS) <= set(rep), set(FIELDS) - set(rep)
    assert rep["completed"] == 30 and rep["failed"] == 0
    assert rep["request_rate"] == 40 and rep["burstiness"] == 0.5
    assert 6 * 30 <= rep["total_output_tokens"] <= 18 * 30  # ignore_eos: exactly the drawn lengths
    assert abs(rep["request_throughput"] - 30 / rep["duration_s"]) < 1e-6
    assert abs(rep["total_token_throughput"] - rep["input_throughput"] - rep["output_throughput"]) < 1e-6
    for m in ["ttft", "tpot", "itl", "e2el"]:
        s = rep[m]
        assert 0 < s["median_ms"] <= s["p90_ms"] <= s["p99_ms"], (m, s)
    assert rep["e2el"]["median_ms"] >= rep["ttft"]["median_ms"]
    # SLOs of ten minutes: every request meets them, so goodput is the request throughput.
    assert rep["goodput"] == pytest.approx(rep["request_throughput"], rel=1e-9)
    assert "Serving Benchmark Result" in r.stdout


def test_goodput_counts_only_the_requests_that_meet_every_slo(server, tmp_path):
    out = tmp_path / "r.json"
    # A TPOT under a microsecond is met by no request of 6 or more output tokens; a TTFT of ten minutes by all.
    r = bench(server, "--num-prompts", "8", "--request-rate", "inf", "--random-input-len", "16", "--random-output-len",
              "8", "--random-range-ratio", "0.25", "--goodput", "ttft:600000,tpot:0.001", "--json", str(out))
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["completed"] == 8 and rep["request_throughput"] > 0
    assert rep["goodput"] == 0, rep


def test_a_concurrency_cap_and_a_jsonl_dataset(server, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "Tell me about paged attention.", "max_tokens": 5}) + "\n" +
                    json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 7}) + "\n")
    out = tmp_path / "r.json"
    r = bench(server, "--num-prompts", "10", "--max-concurrency", "2", "--dataset", str(data), "--json", str(out))
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["completed"] == 10 and rep["max_concurrency"] == 2 and rep["request_rate"] == -1
    assert rep["total_output_tokens"] == 5 * 5 + 5 * 7


def test_a_sweep_writes_a_csv_row_per_rate_and_a_plot(server, tmp_path):
    csv_path, png = tmp_path / "s.csv", tmp_path / "s.png"
    r = bench(server, "--num-prompts", "12", "--request-rates", "10,30,inf", "--random-input-len", "32",
              "--random-output-len", "8", "--csv", str(csv_path))
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(csv_path)))
    assert [row["request_rate"] for row in rows] == ["10.0", "30.0", "-1.0"]
    assert all(int(row["completed"]) == 12 for row in rows)
    subprocess.run([sys.executable, os.path.join(SOURCE_DIR, "tools", "plot_sweep.py"), str(csv_path), str(png)],
                   check=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_and_no_server_are_clear_errors(tmp_path):
    r = subprocess.run([BENCH, "serve", "--request-rate", "-3"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage" in r.stderr
    r = subprocess.run([BENCH, "serve", "--address", "127.0.0.1:1", "--num-prompts", "1"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "no inferd at 127.0.0.1:1" in r.stderr
