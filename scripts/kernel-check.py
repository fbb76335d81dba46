#!/usr/bin/env python3
"""Compiles kernels/*.cu for an sm_XY with NVRTC on a machine without a GPU and prints what ptxas
reports per kernel (registers, spills, shared memory): register pressure and spills can be checked
before a GPU is used. Options as on the device (--fmad=false,
C++17, the includes inlined as build.rs does).

Needs NVRTC: `scripts/kernel-check.py --setup` installs PyPI's nvidia-cuda-nvrtc (and
nvidia-cuda-nvdisasm, for `--sass KERNEL`) into .gpubin/nvrtc-venv, which git ignores.
Usage: scripts/kernel-check.py [--arch sm_90a] [--sass KERNEL]
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".gpubin", "nvrtc-venv")


def setup():
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    pip = os.path.join(VENV, "bin", "pip")
    subprocess.run([pip, "install", "-q", "nvidia-cuda-nvrtc", "nvidia-cuda-nvdisasm"], check=True)


def find(name):
    hits = glob.glob(os.path.join(VENV, "lib", "python*", "site-packages", "nvidia", "cu*", "*", name))
    if not hits:
        sys.exit(f"{name} not found under {VENV}: run scripts/kernel-check.py --setup")
    return hits[0]


def inline_includes(path, seen=None):
    """The file with each local include replaced by that file's (inlined) text, once, as build.rs."""
    seen = set() if seen is None else seen
    source = open(path).read()
    def include(match):
        header = os.path.normpath(os.path.join(os.path.dirname(path), match.group(1)))
        if header in seen:
            return ""
        seen.add(header)
        return inline_includes(header, seen)
    return re.sub(r'^#include "([^"]+)"$', include, source, flags=re.M)


def compile_cubin(nvrtc, path, arch):
    prog = ctypes.c_void_p()
    name = os.path.basename(path).encode()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), inline_includes(path).encode(), name, 0, None, None):
        sys.exit(f"{path}: nvrtcCreateProgram failed")
    options = [f"-arch={arch}".encode(), b"--fmad=false", b"-std=c++17", b"-Xptxas", b"-v"]
    result = nvrtc.nvrtcCompileProgram(prog, len(options), (ctypes.c_char_p * len(options))(*options))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if result:
        sys.exit(f"{path}:\n{log.value.decode()}")
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    return log.value.decode(), cubin.raw


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="store_true", help="install NVRTC and nvdisasm into .gpubin/nvrtc-venv")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--sass", metavar="KERNEL", help="print this kernel's SASS")
    args = parser.parse_args()
    if args.setup:
        setup()
    nvrtc = ctypes.CDLL(find("libnvrtc.so.*"))
    for path in sorted(glob.glob(os.path.join(ROOT, "kernels", "*.cu"))):
        log, cubin = compile_cubin(nvrtc, path, args.arch)
        kernel = None
        for line in log.splitlines():
            if m := re.search(r"Compiling entry function '(\w+)'", line):
                kernel = m.group(1)
            # ptxas's "Potential Performance Loss" notes name serialized wgmma (C7514, C7518, C7519).
            elif "spill" in line or "Used" in line or "arning" in line or "Performance Loss" in line:
                report = re.sub(r"^ptxas\s*(info\s*:)?[\s.]*", "", line)
                print(f"{os.path.basename(path)} {kernel}: {report}")
        if args.sass:
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(cubin)
                f.flush()
                sass = subprocess.run([find("nvdisasm"), "-c", f.name], check=True, capture_output=True, text=True).stdout
            section = re.search(rf"^\.text\.{args.sass}:\n(.*?)(?=^\s*\.section|\Z)", sass, flags=re.M | re.S)
            if section:
                print(section.group(1))


if __name__ == "__main__":
    main()
