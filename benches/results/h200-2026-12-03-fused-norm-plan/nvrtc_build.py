#!/usr/bin/env python3
"""nvrtc_build.py KDIR OUT.cubin [-DNAME[=V] ...]: compile KDIR/detcoll_cuda.cu for sm_90 with the
project's NVRTC flags (headers from KDIR), every world unless -DDC_WORLDS is given."""
import ctypes, glob, os, sys, time
# NVRTC: $NVRTC_LIB, else the CUDA toolkit's (on the device machine, the one its run-time build
# uses), else a pip wheel's (here: NVRTC 13.5, whose LL push code is slower than 13.0's,
# ../h200-2026-12-04-tile-walk.md).
lib = os.environ.get('NVRTC_LIB') or (glob.glob('/usr/local/cuda/lib64/libnvrtc.so.1*') +
    glob.glob('/root/.pyenv/versions/*/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13'))[0]
n = ctypes.CDLL(lib)
kdir, out, defs = sys.argv[1], sys.argv[2], sys.argv[3:]
src = open(f"{kdir}/detcoll_cuda.cu", "rb").read()
prog = ctypes.c_void_p()
# The program is named by its path in KDIR: NVRTC resolves the entry's quoted includes from the
# program's directory first (a bare name would be the working directory, where stale copies of
# the headers were once found before --include-path).
assert n.nvrtcCreateProgram(ctypes.byref(prog), src, f"{kdir}/detcoll_cuda.cu".encode(), 0, None, None) == 0
flags = ["--gpu-architecture=sm_90", "--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--fmad=false",
         "--std=c++17", "--generate-line-info", f"--include-path={kdir}"] + defs
arr = (ctypes.c_char_p * len(flags))(*[f.encode() for f in flags])
t = time.time()
rc = n.nvrtcCompileProgram(prog, len(flags), arr)
sz = ctypes.c_size_t()
n.nvrtcGetProgramLogSize(prog, ctypes.byref(sz)); log = ctypes.create_string_buffer(sz.value)
n.nvrtcGetProgramLog(prog, log)
if rc != 0:
    print(log.value.decode()); sys.exit(1)
n.nvrtcGetCUBINSize(prog, ctypes.byref(sz)); buf = ctypes.create_string_buffer(sz.value)
assert n.nvrtcGetCUBIN(prog, buf) == 0
open(out, "wb").write(buf.raw)
print(f"{out}: {sz.value} bytes in {time.time()-t:.0f}s {defs}")
