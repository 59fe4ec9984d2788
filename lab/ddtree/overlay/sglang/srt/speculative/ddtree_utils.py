"""Lab stand-in for the patched DDTree build's ``ddtree_utils`` module.

The lab lays this file over the SGLang simulator package, as the real build
lays its patched files over the installed SGLang. Its presence is what makes
``--speculative-algorithm DDTREE`` available. The build's tree-verify kernels
are a shared object beside it (``ddtree_kernels.so``, built from
lab/ddtree/src/ddtree_kernels.c by lab/ddtree/build.py); like the real build's,
it was linked against the CUDA 12 runtime (ELF ``DT_NEEDED libcudart.so.12``)
and is opened with ``ctypes.CDLL`` on the first real decode, which is what
crashed ct129 (CUDA 13 user space only) after its health check had passed.
Nothing here declares the library: the file itself says what it needs.
"""

import ctypes
import os

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddtree_kernels.so")
_lib = None


def _load_tree_kernels(path=KERNELS):
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL(path)
    return _lib


def tree_kernels():
    """The tree-verify kernels, opened on first use (the first real decode)."""
    return _load_tree_kernels()


def accept_length(draft, target):
    """How many draft tokens the target accepts (the kernel's longest agreeing prefix)."""
    lib = tree_kernels()
    count = min(len(draft), len(target))
    array = ctypes.c_int * count
    return lib.ddtree_accept_length(array(*draft[:count]), array(*target[:count]), count)
