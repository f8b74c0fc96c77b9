#!/usr/bin/env python3
"""On the GPU machine: the live efficiency metrics of a served model against inferd-bench's offline ratios.

First runs inferd-bench offline on the model for the shapes compared (decode at batch 1 and 64, the 4096-token
prefill), then at once starts inferd on it (the limits inferd-bench uses) and through `inferd-bench serve` runs
the same shapes: one request of 512 + 128 tokens, 64 of them at once, five single prompts of 4096 tokens, each
after the idle time inferd-bench leaves before its timed prompts. Back to back, so that both see the GPU in a
like state. For each shape it compares the mean per-step bandwidth (decode) or FLOPs (prefill) utilisation the
server exported (deltas of the histograms' sum and count around the case) with the ratio inferd-bench measured
offline.
Then energy per generated token from NVML at batch 1 and 64 (longer runs: the energy counter is sampled once a
second). Writes a JSON report; exits 1 when a ratio is off by more than 10% or an NVML series is missing.

  python3 tests/gpu/efficiency_check.py --bin inferd --bench inferd-bench --model DIR --out F
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            values[head] = float(value)
    return values


def serving(address):
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    try:
        stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
        return stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def main():
    ap = argparse.ArgumentParser()
    for a in ["--bin", "--bench", "--model", "--out"]:
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    offline_json = os.path.splitext(args.out)[0] + "_offline.json"
    with open(os.path.splitext(args.out)[0] + "_offline.txt", "w") as log:
        subprocess.run([args.bench, "--model", args.model, "--sections", "prefill,decode", "--batches", "1,64",
                        "--json", offline_json], check=True, stdout=log, stderr=subprocess.STDOUT)
    offline = json.load(open(offline_json))
    port, mport = free_port(), free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    cfg.write(f"model: {{path: {args.model}}}\nengine: {{backend: cuda}}\n"
              "scheduler: {max_num_seqs: 256, max_num_batched_tokens: 8192, max_queue: 1000}\n"
              f"server: {{listen: '127.0.0.1:{port}', metrics_listen: '127.0.0.1:{mport}'}}\n")
    cfg.close()
    log = open(os.path.splitext(args.out)[0] + "_server.log", "w")
    server = subprocess.Popen([args.bin, "--config", cfg.name], stdout=log, stderr=subprocess.STDOUT)
    address = f"127.0.0.1:{port}"
    report, failures = {"cases": {}}, []
    try:
        end = time.time() + 300
        while not serving(address):
            if server.poll() is not None or time.time() > end:
                sys.exit(f"inferd did not start serving (see {log.name})")
            time.sleep(0.5)

        def run(prompts, input_len, output_len, seed):
            subprocess.run([args.bench, "serve", "--address", address, "--num-prompts", str(prompts), "--warmup", "0",
                            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
                            "--request-rate", "inf", "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)

        def delta(before, after, key):
            return after.get(key, 0.0) - before.get(key, 0.0)

        run(8, 512, 16, 1)  # warm-up: clocks up, shapes seen
        # The prefill is timed as inferd-bench times it: single prompts, each after the GPU sat idle for the same
        # time (a FLOPs-bound step's speed depends on the power drawn in the second before it).
        idle_s = offline["prefill_4096"]["idle_before_ms"] / 1e3
        cases = [("decode_batch1", 1, 512, 128, "bandwidth", "decode", "bandwidth_utilisation", 1),
                 ("decode_batch64", 64, 512, 128, "bandwidth", "decode", "bandwidth_utilisation", 1),
                 ("prefill_4096", 1, 4096, 1, "flops", "prefill", "flops_utilisation", 5)]
        for seed, (name, prompts, input_len, output_len, what, kind, key, repeats) in enumerate(cases, start=10):
            before = scrape(mport)
            for i in range(repeats):
                if repeats > 1:
                    time.sleep(idle_s)
                run(prompts, input_len, output_len, 100 * seed + i)
            after = scrape(mport)
            family = f"inferd_step_model_{what}_utilization_ratio"
            count = delta(before, after, f'{family}_count{{kind="{kind}"}}')
            live = delta(before, after, f'{family}_sum{{kind="{kind}"}}') / count if count else 0.0
            ref = offline[name][key]
            ok = abs(live / ref - 1) <= 0.10 if ref > 0 else False
            report["cases"][name] = {"live_mean_per_step": live, "steps": count, "offline": ref,
                                     "live_over_offline": live / ref if ref else None, "within_10_percent": ok}
            print(f"{name:16s} {what} utilisation: live {100 * live:5.1f}% over {int(count)} {kind} steps, "
                  f"inferd-bench offline {100 * ref:5.1f}%  ratio {live / ref:.3f}  {'ok' if ok else 'OFF BY > 10%'}")
            if not ok:
                failures.append(name)
        for name, prompts, input_len, output_len in [("batch1", 1, 128, 1024), ("batch64", 64, 512, 512)]:
            time.sleep(1.5)  # the sampler's period: the counters before start after idle
            before = scrape(mport)
            t0 = time.time()
            run(prompts, input_len, output_len, 40 + prompts)
            seconds = time.time() - t0
            time.sleep(1.5)
            after = scrape(mport)
            joules = delta(before, after, "inferd_gpu_energy_joules_total")
            tokens = delta(before, after, "inferd_generation_tokens_total")
            hist_n = delta(before, after, "inferd_sampled_energy_per_generated_token_joules_count")
            hist = delta(before, after, "inferd_sampled_energy_per_generated_token_joules_sum") / hist_n if hist_n else 0
            per_token = joules / tokens if tokens else 0
            watts = after.get("inferd_gpu_power_watts", 0)
            report[f"energy_{name}"] = {"joules": joules, "tokens": tokens, "joules_per_token": per_token,
                                        "sampled_mean_joules_per_token": hist, "sample_periods": hist_n,
                                        "run_seconds": seconds}
            print(f"energy, {name:8s} {tokens:6.0f} tokens in {seconds:4.1f} s: {joules:7.1f} J = {per_token:.4f} J/token "
                  f"({int(hist_n)} one-second samples in the histogram)")
            if not (0 < per_token < 100):
                failures.append(f"energy_{name}")
        # Host memory of the serving process once it serves: the checkpoint's mapped pages are released after the
        # upload, so what stays is the CUDA context, pinned step buffers and the process itself.
        status = dict(line.split(":", 1) for line in open(f"/proc/{server.pid}/status") if ":" in line)
        kib = lambda key: int(status.get(key, "0 kB").split()[0])  # noqa: E731
        report["rss_bytes"] = kib("VmRSS") * 1024
        report["rss_file_bytes"] = kib("RssFile") * 1024
        report["rss_anon_bytes"] = kib("RssAnon") * 1024
        print(f"serving process resident memory: {report['rss_bytes'] / 2**30:.2f} GiB "
              f"({report['rss_anon_bytes'] / 2**30:.2f} anonymous, {report['rss_file_bytes'] / 2**30:.2f} file-backed); "
              f"goal under 2 GiB: {'met' if report['rss_bytes'] < 2 * 2**30 else 'missed'}")
        last = scrape(mport)
        for series in ["inferd_gpu_power_watts", "inferd_gpu_temperature_celsius", "inferd_gpu_sm_clock_hertz",
                       "inferd_gpu_utilization_ratio", "inferd_gpu_memory_used_bytes",
                       "inferd_device_read_bandwidth_ceiling_bytes_per_second",
                       "inferd_device_gemm_ceiling_flops_per_second"]:
            report[series] = last.get(series)
            if series not in last:
                failures.append(series)
        print("NVML now: {:.0f} W, {:.0f} C, SM {:.0f} MHz, {:.1f} GiB used; ceilings at start-up: read {:.2f} TB/s, "
              "GEMM {:.0f} TFLOP/s (inferd-bench: {:.2f} TB/s, {:.0f} TFLOP/s)".format(
                  last.get("inferd_gpu_power_watts", 0), last.get("inferd_gpu_temperature_celsius", 0),
                  last.get("inferd_gpu_sm_clock_hertz", 0) / 1e6, last.get("inferd_gpu_memory_used_bytes", 0) / 2**30,
                  last.get("inferd_device_read_bandwidth_ceiling_bytes_per_second", 0) / 1e12,
                  last.get("inferd_device_gemm_ceiling_flops_per_second", 0) / 1e12,
                  offline["read_ceiling_tb_s"], offline["gemm_ceiling_tflop_s"]))
    finally:
        server.terminate()
        server.wait(timeout=60)
        report["failures"] = failures
        json.dump(report, open(args.out, "w"), indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
