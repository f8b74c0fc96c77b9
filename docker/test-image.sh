#!/usr/bin/env bash
# Tests the CPU image end to end with podman on loopback: builds it (docker/build-images.sh; SKIP_BUILD=1 to use
# the one there), runs it read-only, waits for the container's own health check, sends generate and chat requests
# from outside, scrapes /metrics, checks it runs as non-root on a read-only root filesystem, then sends SIGTERM
# during a stream and checks the drain (docker/image_check.py). Prints the time from container start to SERVING.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF="$PWD/docker/containers.conf"
if [[ -z "${SKIP_BUILD:-}" ]]; then
  # A build needs about 4 GiB where podman keeps its images (the toolchain stage is 1.3 GB, its layers are
  # written twice while committed, plus the build tree). With INFERD_IMAGE_TEST_OPTIONAL a machine short of it
  # skips, saying so, rather than failing halfway through with "no space left on device".
  store=$(podman info --format '{{.Store.GraphRoot}}' 2>/dev/null || echo /var/lib/containers)
  while [[ ! -d $store ]]; do store=$(dirname "$store"); done
  free_gib=$(($(df -Pk "$store" | awk 'NR == 2 { print $4 }') / 1048576))
  if ((free_gib < 4)); then
    if [[ -n "${INFERD_IMAGE_TEST_OPTIONAL:-}" ]]; then
      echo "test-image: skipped: $store has $free_gib GiB free, and building the image needs 4"
      exit 0
    fi
    echo "test-image: $store has $free_gib GiB free, and building the image needs 4" >&2
    exit 1
  fi
  BASE_ONLY=1 bash docker/build-images.sh
  # INFERD_IMAGE_TEST_OPTIONAL=1 (CI): a machine that cannot run a container at all skips the test, saying why;
  # once one runs, every failure is the image's.
  if ! podman run --rm --network none localhost/inferd-base:bookworm true >/dev/null 2>/tmp/inferd-podman-probe.txt; then
    if [[ -n "${INFERD_IMAGE_TEST_OPTIONAL:-}" ]]; then
      echo "test-image: skipped: this machine cannot run a container ($(tail -n 1 /tmp/inferd-podman-probe.txt))"
      exit 0
    fi
    cat /tmp/inferd-podman-probe.txt >&2
    exit 1
  fi
  bash docker/build-images.sh cpu
fi
[[ -x .venv/bin/python ]] || bash scripts/setup.sh
name=inferd-image-test-$$
free_port() { .venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
mport=$(free_port)
hport=$(free_port)
trap 'podman rm -f "$name" >/dev/null 2>&1 || true' EXIT
start=$(date +%s.%N)
podman run -d --name "$name" --read-only -p "127.0.0.1:$port:50051" -p "127.0.0.1:$mport:9090" \
  -p "127.0.0.1:$hport:8000" localhost/inferd:cpu \
  >/dev/null
for _ in $(seq 1 240); do
  podman healthcheck run "$name" >/dev/null 2>&1 && break
  sleep 0.25
done
if ! podman healthcheck run "$name" >/dev/null 2>&1; then
  podman logs "$name" >&2
  echo "test-image: the container's health check never passed" >&2
  exit 1
fi
echo "test-image: container start to SERVING (its health check) in $(echo "$(date +%s.%N) - $start" | bc) s"
[[ "$(podman exec "$name" id -u)" == 10001 ]] || { echo "test-image: not running as uid 10001" >&2; exit 1; }
if podman exec "$name" touch /etc/inferd/x 2>/dev/null; then
  echo "test-image: the root filesystem is writable" >&2
  exit 1
fi
metrics=$(curl -sf "127.0.0.1:$mport/metrics" || true)
grep -q '^inferd_' <<<"$metrics" || { echo "test-image: /metrics has no inferd_ series" >&2; exit 1; }
echo "test-image: /metrics serves $(grep -c '^inferd_' <<<"$metrics") inferd_ samples"
.venv/bin/python docker/image_check.py "127.0.0.1:$port" "$name" "http://127.0.0.1:$hport"
echo "test-image: ok ($(podman images --format '{{.Size}}' localhost/inferd:cpu))"
