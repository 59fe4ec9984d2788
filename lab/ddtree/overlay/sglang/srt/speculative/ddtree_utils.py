"""Lab stand-in for the patched DDTree build's ``ddtree_utils`` module.

The lab lays this file over the SGLang simulator package, as the real build
lays its patched files over the installed SGLang. Its presence is what makes
``--speculative-algorithm DDTREE`` available. The real build's tree-verify
kernels were compiled against the CUDA 12 runtime and are opened with
``ctypes.CDLL`` on the first real decode, which is what crashed ct129
(CUDA 13 user space only) after its health check had passed.
"""

CUDA_LIBRARIES = ["libcudart.so.12"]
