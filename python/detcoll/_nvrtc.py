"""Points the CUDA backend at NVRTC when only a pip wheel has it.

The kernels are compiled at run time by NVRTC. PyTorch's CUDA wheels depend on
``nvidia-cuda-nvrtc``, whose ``libnvrtc.so.*`` sits in ``site-packages/nvidia/.../lib``, outside
the dynamic loader's path: the Rust side looks at ``$DETCOLL_NVRTC`` (set here when unset),
``$CUDA_HOME`` and ``/usr/local/cuda``.
"""

import glob
import os
import sys


def candidates():
    """libnvrtc files of pip's nvidia packages on ``sys.path``, newest first."""
    found = []
    for base in sys.path:
        if not base or not os.path.isdir(os.path.join(base, "nvidia")):
            continue
        for pattern in ("nvidia/cuda_nvrtc/lib/libnvrtc.so.*", "nvidia/cu*/lib/libnvrtc.so.*"):
            found += [p for p in glob.glob(os.path.join(base, pattern)) if "builtins" not in os.path.basename(p)]
    return sorted(set(found), reverse=True)


def ensure() -> None:
    """Sets ``DETCOLL_NVRTC`` to a pip-installed NVRTC when the variable is unset and one exists."""
    if os.environ.get("DETCOLL_NVRTC"):
        return
    libs = candidates()
    if libs:
        os.environ["DETCOLL_NVRTC"] = libs[0]
