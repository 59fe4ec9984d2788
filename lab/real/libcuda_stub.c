/*
 * libcuda.so.1 TEST DOUBLE: a stand-in for the NVIDIA driver library on lab
 * machines without a GPU (built by lab/real/build.sh with gcc).
 *
 * Every sgl-kernel / sglang-kernel wheel on PyPI is a CUDA build, and its
 * shared objects link against libcuda.so.1, which real SGLang imports even
 * with --device cpu. This library exports the driver calls those objects
 * name (nm -D --undefined-only on sgl_kernel/ .so files of sglang 0.5.11 and
 * 0.5.23, plus cuInit and cuDeviceGetCount, which loaders probe) and answers
 * every one with CUDA_ERROR_NO_DEVICE (100): the machine has no GPU, which is
 * the truth. It is never installed on a real host.
 */
#include <stddef.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100

int cuGetErrorString(int error, const char **text)
{
    if (text == NULL)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    *text = error == CUDA_ERROR_NO_DEVICE
        ? "no CUDA-capable device is detected (libcuda.so.1 test double)"
        : "unknown error (libcuda.so.1 test double)";
    return CUDA_SUCCESS;
}

#define NO_DEVICE(name) int name(void) { return CUDA_ERROR_NO_DEVICE; }
NO_DEVICE(cuInit)
NO_DEVICE(cuDeviceGetCount)
NO_DEVICE(cuDriverGetVersion)
NO_DEVICE(cuGetProcAddress_v2)
NO_DEVICE(cuCtxFromGreenCtx)
NO_DEVICE(cuCtxPopCurrent_v2)
NO_DEVICE(cuCtxPushCurrent_v2)
NO_DEVICE(cuDevResourceGenerateDesc)
NO_DEVICE(cuDevSmResourceSplitByCount)
NO_DEVICE(cuDeviceGetDevResource)
NO_DEVICE(cuGreenCtxCreate)
NO_DEVICE(cuGreenCtxDestroy)
NO_DEVICE(cuGreenCtxGetDevResource)
NO_DEVICE(cuMemAddressFree)
NO_DEVICE(cuMemGetAddressRange_v2)
NO_DEVICE(cuMemRelease)
NO_DEVICE(cuMemRetainAllocationHandle)
NO_DEVICE(cuMemSetAccess)
NO_DEVICE(cuMemUnmap)
NO_DEVICE(cuPointerGetAttribute)
NO_DEVICE(cuStreamCreate)
