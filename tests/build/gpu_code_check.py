"""The GPU code a build's kernels carry, read with cuobjdump, against the build's CUDA_ARCHITECTURES.

usage: gpu_code_check.py CUOBJDUMP LIBRARY ARCHS   (ARCHS: CMake's list, entries split by commas)

Every object file of the kernels library must carry machine code for each entry built as machine code ("90a",
"86-real") and PTX for each built as PTX ("90a", "120-virtual"), nothing else, and the same kernels in each
machine code: no kernel left out of one GPU generation (engine/backends/cuda/architectures.cc says which GPUs
run which code). Kernels the cuda backend chooses only where the device runs sm_90a code (RunsSm90aCode in
kernels/device_code.h: FlashInfer's Hopper prefill attention, CUTLASS's grouped GEMM for experts) must hold wgmma
(HGMMA in the SASS) in the sm_90a machine code wherever the build carries it: compiled without sm_90a's features
their bodies are empty. Exits non-zero, naming the object, the architecture and the kernels, where one does not.
The SASS is read with nvdisasm, which must sit beside cuobjdump.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SM90A_ONLY = ("paged_attention_hopper_bf16.cu.o", "paged_attention_hopper_f16.cu.o", "moe_grouped_gemm.cu.o")


def expected(archs):
    sass, ptx = set(), set()
    for entry in archs.split(","):
        code = entry.removesuffix("-real").removesuffix("-virtual")
        if not entry.endswith("-virtual"):
            sass.add("sm_" + code)
        if not entry.endswith("-real"):
            ptx.add("sm_" + code)
    return sass, ptx


def carried(cuobjdump, library):
    """{object: {"elf": {arch: set(functions)}, "ptx": set(archs)}} from cuobjdump --dump-resource-usage."""
    out = subprocess.run([cuobjdump, "--dump-resource-usage", library], check=True, capture_output=True,
                         text=True).stdout
    objects, obj, kind, arch = {}, None, None, None
    for line in out.splitlines():
        if m := re.match(r"member .*:(\S+\.o):$", line):
            obj = objects.setdefault(m.group(1), {"elf": {}, "ptx": set()})
        elif line.startswith("Fatbin elf code"):
            kind = "elf"
        elif line.startswith("Fatbin ptx code"):
            kind = "ptx"
        elif (m := re.match(r"arch = (\S+)", line)) and obj is not None:
            arch = m.group(1)
            if kind == "elf":
                obj["elf"].setdefault(arch, set())
            else:
                obj["ptx"].add(arch)
        elif (m := re.match(r"\s*Function (\S+):", line)) and kind == "elf" and obj is not None:
            obj["elf"][arch].add(m.group(1))
    return objects


def wgmma_count(cuobjdump, library, member):
    """HGMMA instructions in one object's sm_90a machine code (the object taken out of the archive first)."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["ar", "x", os.path.abspath(library), member], cwd=tmp, check=True)
        env = dict(os.environ, PATH=os.path.dirname(cuobjdump) + os.pathsep + os.environ.get("PATH", ""))
        sass = subprocess.run([cuobjdump, "-sass", "-arch", "sm_90a", os.path.join(tmp, member)], check=True,
                              capture_output=True, text=True, env=env).stdout
    return sum(1 for line in sass.splitlines() if "HGMMA" in line)


def main():
    cuobjdump, library, archs = sys.argv[1:4]
    sass, ptx = expected(archs)
    objects = carried(cuobjdump, library)
    problems = []
    if not objects:
        problems.append(f"cuobjdump found no object files with GPU code in {library}")
    for name, code in sorted(objects.items()):
        if set(code["elf"]) != sass:
            problems.append(f"{name}: machine code for {sorted(code['elf'])}, the build asks for {sorted(sass)}")
        if code["ptx"] != ptx:
            problems.append(f"{name}: PTX for {sorted(code['ptx'])}, the build asks for {sorted(ptx)}")
        kernels = set().union(*code["elf"].values()) if code["elf"] else set()
        for arch, functions in sorted(code["elf"].items()):
            if missing := kernels - functions:
                problems.append(f"{name}: {arch} lacks {len(missing)} kernels, e.g. {sorted(missing)[0][:120]}")
    if "sm_90a" in sass:
        for member in SM90A_ONLY:
            if member not in objects:
                problems.append(f"{member}: not in {library}")
            elif not shutil.which("nvdisasm", path=os.path.dirname(cuobjdump)):
                problems.append(f"nvdisasm is not beside {cuobjdump} (scripts/setup.sh installs it): {member}'s "
                                "sm_90a code cannot be read")
            elif wgmma_count(cuobjdump, library, member) == 0:
                problems.append(f"{member}: its sm_90a machine code holds no wgmma (HGMMA): built without sm_90a's "
                                "features, the kernels the backend chooses on Hopper would do nothing")
    for p in problems:
        print("FAIL", p)
    n = sum(len(f) for c in objects.values() for f in c["elf"].values())
    print(f"{len(objects)} objects, {n} kernel builds over machine code {sorted(sass)}, PTX {sorted(ptx)}: "
          f"{'ok' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
