#!/usr/bin/env bash
# On a GPU host without a container runtime: runs the CUDA image's own inferd from the image's root filesystem
# (.image-payload/payload.tar.xz, made by docker/export-payload.sh) in a chroot set up the way the NVIDIA container
# runtime sets up a container: the GPU device nodes and the driver's libraries (libcuda, NVML, the PTX JIT) bound
# in, the host's libcudart and cuBLASLt where the image keeps its own (their SHA-256 against the image's), a
# read-only root with tmpfs on /tmp and /run, the model mounted read-only, uid 10001. Serves the Llama-3-8B-shaped
# random model (written here) and checks it from outside (docker/payload_check.py). Needs root and a GPU.
#   bash docker/run-payload.sh OUT_DIR       (scripts/gpu_run.sh image)
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1
mkdir -p "$out"
W=/tmp/inferd-image-payload
R=$W/rootfs
M=${INFERD_8B_MODEL:-/tmp/llama3-8b-random}
cleanup() { umount -R "$R" 2>/dev/null || true; }
cleanup
rm -rf "$W" && mkdir -p "$W"
tar -C "$W" -xJf .image-payload/payload.tar.xz
[[ -f $M/model.safetensors.index.json ]] || python3 tools/make_llama3_8b_random.py "$M" >/dev/null
chmod -R a+rX "$M"   # the image runs as uid 10001: the model must be readable by it
trap cleanup EXIT

bind() {  # bind SOURCE (a file or directory) at PATH inside the root, read-only when a third argument says ro
  local dest=$R$2
  if [[ -d $1 ]]; then mkdir -p "$dest"; else mkdir -p "$(dirname "$dest")"; touch "$dest"; fi
  mount --bind "$1" "$dest"
  [[ ${3:-} == ro ]] && mount -o remount,bind,ro "$dest"
  return 0
}
# The driver's user-space libraries, as the NVIDIA runtime injects them, then the image's linker cache.
ldconfig -p | awk '$1 ~ /^lib(cuda|nvidia-ml|nvidia-ptxjitcompiler|nvidia-nvvm|nvidia-gpucomp)\.so\./ && /x86-64/ {print $1, $NF}' |
  sort -u -k1,1 | while read -r name path; do
    cp -L "$path" "$R/usr/lib/x86_64-linux-gnu/$name"   # copied: ldconfig in the root needs them before it goes read-only
    echo "driver library: $name <- $(readlink -f "$path")"
  done | tee "$out/image_payload_libs.txt"
# The CUDA libraries the image carries, from the host: the same files?
while read -r hash path; do
  name=$(basename "$path")
  host=$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ {print $NF; exit}')
  [[ -n $host ]] || host=$(python3 -c "import nvidia, os, sys; print(next(os.path.join(d, 'cu13/lib', sys.argv[1]) for d in nvidia.__path__ if os.path.exists(os.path.join(d, 'cu13/lib', sys.argv[1]))))" "$name")
  got=$(sha256sum "$(readlink -f "$host")" | cut -d' ' -f1)
  same="the image's own file"; [[ $got == "$hash" ]] || same="a different file than the image's"
  echo "cuda library: /$path <- $(readlink -f "$host"): $same" | tee -a "$out/image_payload_libs.txt"
  cp -L "$host" "$R/$path"
done < "$W/cuda-libs.sha256"
chroot "$R" ldconfig

mount --bind "$R" "$R"   # a mount of its own, made read-only once the mount points in it are made
for d in /dev/nvidia* /dev/null /dev/zero /dev/urandom /dev/random; do bind "$d" "$d"; done
mount -t proc proc "$R/proc"
bind /sys /sys ro
for d in /tmp /run /dev/shm; do mkdir -p "$R$d" 2>/dev/null || true; mount -t tmpfs -o mode=1777 tmpfs "$R$d"; done
bind "$M" /models/llama3-8b ro
printf "model: {path: /models/llama3-8b}\nengine: {backend: cuda}\nscheduler: {max_num_seqs: 128, max_num_batched_tokens: 8192}\nserver: {listen: '127.0.0.1:50051', metrics_listen: '127.0.0.1:9090'}\n" \
  > "$W/config.yaml"
bind "$W/config.yaml" /etc/inferd/payload.yaml ro
mount -o remount,bind,ro "$R"

run_in_image=(env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/ "$(command -v chroot)" --userspec=10001:10001 "$R")
INFERD_PY_STUBS="$W/pystubs" PYTHONPATH="$W/pystubs" python3 docker/payload_check.py \
  --address 127.0.0.1:50051 --out "$out/image_payload.json" --server-log "$out/image_server.log" \
  --probe "${run_in_image[*]} /usr/local/bin/inferd health-probe --address 127.0.0.1:50051" \
  -- "${run_in_image[@]}" /usr/local/bin/inferd --config /etc/inferd/payload.yaml
