"""The GPU code a build's kernels carry, read with cuobjdump, against the build's CUDA_ARCHITECTURES.

usage: gpu_code_check.py CUOBJDUMP LIBRARY ARCHS   (ARCHS: CMake's list, entries split by commas)

Every object file of the kernels library must carry machine code for each entry built as machine code ("90a",
"86-real") and PTX for each built as PTX ("90a", "120-virtual"), nothing else, and the same kernels in each
machine code: no kernel left out of one GPU generation (engine/backends/cuda/architectures.cc says which GPUs
run which code). Exits non-zero, naming the object, the architecture and the kernels, where one does not.
"""
import re
import subprocess
import sys


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
    for p in problems:
        print("FAIL", p)
    n = sum(len(f) for c in objects.values() for f in c["elf"].values())
    print(f"{len(objects)} objects, {n} kernel builds over machine code {sorted(sass)}, PTX {sorted(ptx)}: "
          f"{'ok' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
