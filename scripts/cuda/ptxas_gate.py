#!/usr/bin/env python3
"""The ptxas gate: resource limits of the CUDA kernels that the CUDA interpreter cannot see.

For CUDA 12 and CUDA 13 in turn, this
1. installs NVRTC and ptxas from NVIDIA's PyPI wheels (pip --target under target/, no GPU
   and no toolkit needed): nvidia-cuda-nvrtc-cu12 (the folder scripts/test.sh installs) and
   nvidia-cuda-nvcc-cu12; nvidia-cuda-nvrtc and nvidia-cuda-nvcc 13.x (CUDA 13 dropped the
   -cuXX suffix; its files are under nvidia/cu13/). The nvcc wheels are installed without
   their dependencies: ptxas is one self-contained binary;
2. compiles every kernel module (crates/pagoda-cuda/src/kernels/*.cu) to PTX for sm_80 and
   sm_90 with that NVRTC, through pagoda-cuda's own compile path (the write_ptx example:
   same source, same options as a GPU run), and checks which NVRTC version compiled them;
3. runs `ptxas -v` of the same CUDA version on each and prints, per kernel, registers,
   stack frame, spill stores/loads and static shared memory.

It fails (exit 1) when ptxas rejects a module, or on any kernel with
- a spill store or load (registers spilled to local memory: slow, and a sign the kernel
  outgrew its __launch_bounds__);
- a stack frame, except the kernels in STACK_ALLOWANCE: sincosf's accurate slow path
  (Payne-Hanek reduction of large angles, rope) keeps a small array on the stack, and only
  for arguments beyond ~105615 rad, i.e. never on the hot path;
- static shared memory over 48 KiB (the most a block gets without the dynamic-shared-memory
  opt-in, which Pagoda does not use). NVRTC already refuses such a module for a real
  architecture ("uses too much shared data"), which fails the compile step; the check here
  keeps the rule explicit.

Without a wheel (no network), a CUDA version is skipped with a message, unless CI=true,
where that fails. Usage: scripts/cuda/ptxas_gate.py [--only 12|13] [--keep DIR]
"""

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "target"
ARCHS = ("sm_80", "sm_90")
SMEM_LIMIT = 48 * 1024
# Kernel name -> largest stack frame (bytes) allowed, and why.
STACK_ALLOWANCE = {
    # 32 B with NVRTC/ptxas 12.9 and 13.5, sm_80 and sm_90.
    "rope": (48, "sincosf's slow path for huge angles (Payne-Hanek reduction array)"),
}


@dataclass
class Toolchain:
    cuda: str  # CUDA major version, "12" or "13"
    nvrtc_pkg: str
    nvrtc_dir: Path
    nvrtc_lib: str  # folder under nvrtc_dir holding libnvrtc.so.N
    nvcc_pkg: str
    nvcc_dir: Path
    ptxas: str  # path under nvcc_dir

    def nvrtc_lib_dir(self) -> Path:
        return self.nvrtc_dir / self.nvrtc_lib

    def ptxas_path(self) -> Path:
        return self.nvcc_dir / self.ptxas


TOOLCHAINS = [
    Toolchain(
        cuda="12",
        nvrtc_pkg="nvidia-cuda-nvrtc-cu12",
        nvrtc_dir=TARGET / "nvrtc",  # shared with scripts/test.sh
        nvrtc_lib="nvidia/cuda_nvrtc/lib",
        nvcc_pkg="nvidia-cuda-nvcc-cu12",
        nvcc_dir=TARGET / "cuda-gate" / "nvcc12",
        ptxas="nvidia/cuda_nvcc/bin/ptxas",
    ),
    Toolchain(
        cuda="13",
        nvrtc_pkg="nvidia-cuda-nvrtc==13.*",
        nvrtc_dir=TARGET / "cuda-gate" / "nvrtc13",
        nvrtc_lib="nvidia/cu13/lib",
        nvcc_pkg="nvidia-cuda-nvcc==13.*",
        nvcc_dir=TARGET / "cuda-gate" / "nvcc13",
        ptxas="nvidia/cu13/bin/ptxas",
    ),
]


@dataclass
class Kernel:
    name: str
    arch: str = ""
    registers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem: int = 0
    problems: list = field(default_factory=list)


def pip_install(package: str, target: Path) -> bool:
    base = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    args = ["--no-deps", "--target", str(target), package]
    for extra in ([], ["--break-system-packages"]):
        if subprocess.run(base + extra + args).returncode == 0:
            return True
    return False


def ensure(toolchain: Toolchain) -> str | None:
    """Installs what is missing; answers why the toolchain is unusable, or None."""
    wanted = [
        (toolchain.nvrtc_pkg, toolchain.nvrtc_dir, toolchain.nvrtc_lib_dir() / f"libnvrtc.so.{toolchain.cuda}"),
        (toolchain.nvcc_pkg, toolchain.nvcc_dir, toolchain.ptxas_path()),
    ]
    for package, folder, needed in wanted:
        if not needed.exists() and not pip_install(package, folder):
            return f"installing {package} failed"
        if not needed.exists():
            return f"{package} installed but {needed} is missing"
    return None


def write_ptx(toolchain: Toolchain, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PAGODA_CUDA_INTERPRET"}
    # Only this NVRTC on the search path (cudarc tries libnvrtc.so.13 before .so.12).
    env["LD_LIBRARY_PATH"] = str(toolchain.nvrtc_lib_dir())
    cmd = ["cargo", "run", "--quiet", "-p", "pagoda-cuda", "--example", "write_ptx", "--", str(out), *ARCHS]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"write_ptx with NVRTC {toolchain.cuda} failed:\n{done.stdout}{done.stderr}")
    version = done.stdout.splitlines()[0] if done.stdout else ""
    if not version.startswith(f"nvrtc {toolchain.cuda}."):
        raise SystemExit(f"expected NVRTC {toolchain.cuda}, write_ptx reports {version!r}")
    print(f"  {version} (from {toolchain.nvrtc_lib_dir()})")


ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(\w+)'")
PROPS = re.compile(r"Function properties for (\w+)")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers")
SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(text: str) -> list[Kernel]:
    """Kernels of one `ptxas -v` log. Properties of a non-inlined callee (its own
    'Function properties' block, not an entry) are ignored: its frame is counted in the
    entry's stack frame."""
    kernels: dict[str, Kernel] = {}
    current = None  # entry whose lines follow
    props_of = None  # function whose 'Function properties' block follows
    for line in text.splitlines():
        if m := ENTRY.search(line):
            current = kernels.setdefault(m.group(1), Kernel(m.group(1), m.group(2)))
            props_of = None
        elif m := PROPS.search(line):
            props_of = m.group(1)
        elif m := FRAME.search(line):
            if props_of in kernels:
                k = kernels[props_of]
                k.stack, k.spill_stores, k.spill_loads = map(int, m.groups())
        elif (m := USED.search(line)) and current is not None:
            current.registers = int(m.group(1))
            if s := SMEM.search(line):
                current.smem = int(s.group(1))
    return list(kernels.values())


def judge(k: Kernel) -> None:
    if k.spill_stores or k.spill_loads:
        k.problems.append(f"spills ({k.spill_stores} B stored, {k.spill_loads} B loaded)")
    allowed, _ = STACK_ALLOWANCE.get(k.name, (0, ""))
    if k.stack > allowed:
        k.problems.append(f"stack frame {k.stack} B (allowed {allowed} B)")
    if k.smem > SMEM_LIMIT:
        k.problems.append(f"static shared memory {k.smem} B > {SMEM_LIMIT} B")


def check(toolchain: Toolchain, ptx_dir: Path) -> tuple[list[tuple[str, Kernel]], list[str]]:
    rows, failures = [], []
    for arch in ARCHS:
        for ptx in sorted(ptx_dir.glob(f"*-{arch}.ptx")):
            module = ptx.name[: -len(f"-{arch}.ptx")]
            cmd = [str(toolchain.ptxas_path()), "-v", f"-arch={arch}", "-o", os.devnull, str(ptx)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            log = done.stdout + done.stderr
            if done.returncode != 0:
                errors = [l for l in log.splitlines() if "error" in l.lower()]
                failures.append(f"CUDA {toolchain.cuda} {arch} {module}: ptxas failed: " + "; ".join(errors or [log[-400:]]))
                continue
            kernels = parse_ptxas(log)
            if not kernels:
                failures.append(f"CUDA {toolchain.cuda} {arch} {module}: no kernel in ptxas -v output")
            for k in kernels:
                judge(k)
                rows.append((module, k))
                failures += [f"CUDA {toolchain.cuda} {arch} {module}/{k.name}: {p}" for p in k.problems]
    return rows, failures


def print_table(cuda: str, rows: list[tuple[str, Kernel]]) -> None:
    """One row per kernel, each figure as sm_80/sm_90 (bytes, but registers)."""
    by_kernel: dict[tuple[str, str], dict[str, Kernel]] = {}
    for module, k in rows:
        by_kernel.setdefault((module, k.name), {})[k.arch] = k
    head = ("module", "kernel", "registers", "stack", "spill st/ld", "static smem", "")

    def per_arch(ks: dict[str, Kernel], figure) -> str:
        return "/".join(figure(ks[a]) if a in ks else "-" for a in ARCHS)

    body = [
        (
            module,
            name,
            per_arch(ks, lambda k: str(k.registers)),
            per_arch(ks, lambda k: str(k.stack)),
            per_arch(ks, lambda k: f"{k.spill_stores}+{k.spill_loads}"),
            per_arch(ks, lambda k: str(k.smem)),
            "FAIL" if any(k.problems for k in ks.values()) else "ok",
        )
        for (module, name), ks in by_kernel.items()
    ]
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    print(f"  ptxas -v, CUDA {cuda}, {'/'.join(ARCHS)}")
    for r in [head, *body]:
        cells = (c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        print("  " + "  ".join(cells).rstrip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=[t.cuda for t in TOOLCHAINS], help="check one CUDA version")
    args = parser.parse_args()
    ci = os.environ.get("CI") == "true"
    failures = []
    checked = 0
    for toolchain in TOOLCHAINS:
        if args.only and toolchain.cuda != args.only:
            continue
        print(f"== CUDA {toolchain.cuda}: NVRTC {toolchain.nvrtc_pkg}, ptxas {toolchain.nvcc_pkg}")
        why = ensure(toolchain)
        if why:
            if ci:
                failures.append(f"CUDA {toolchain.cuda}: {why}")
            else:
                print(f"  skipped: {why}")
            continue
        ptx_dir = TARGET / "cuda-gate" / f"ptx{toolchain.cuda}"
        write_ptx(toolchain, ptx_dir)
        done = subprocess.run([str(toolchain.ptxas_path()), "--version"], capture_output=True, text=True)
        print("  ptxas " + (done.stdout.strip().splitlines() or ["?"])[-1])
        rows, bad = check(toolchain, ptx_dir)
        print_table(toolchain.cuda, rows)
        failures += bad
        checked += 1
    for name, (bytes_, why) in STACK_ALLOWANCE.items():
        print(f"stack allowance: {name} up to {bytes_} B ({why})")
    if failures:
        print("ptxas gate FAILED:", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        return 1
    print(f"ptxas gate passed ({checked} CUDA version(s): no spills, stacks within allowance, static smem <= 48 KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
