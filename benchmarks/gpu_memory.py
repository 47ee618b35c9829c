"""The GPU's memory as CUDA's driver sees it, read through libcuda with
ctypes (no CUDA toolkit or framework needed): what a benchmark sizes its
data by, and what is in use on the GPU. Every function returns None where
the driver cannot say (no GPU, no libcuda), and initialises CUDA in the
calling process: call it after any worker processes have forked."""
import ctypes


def _device(ordinal):
    """(libcuda, CUdevice) of the ordinal-th visible GPU, or None."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device = ctypes.c_int()
    try:
        if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(device), ordinal):
            return None
    except AttributeError:
        return None
    return cuda, device


def total_bytes(ordinal=0):
    """The ordinal-th visible GPU's memory in bytes (cuDeviceTotalMem)."""
    found = _device(ordinal)
    if found is None:
        return None
    cuda, device = found
    total = ctypes.c_size_t()
    try:
        if cuda.cuDeviceTotalMem_v2(ctypes.byref(total), device):
            return None
    except AttributeError:
        return None
    return total.value


def used_bytes(ordinal=0):
    """Bytes in use on the ordinal-th visible GPU, by every process on it
  (cuMemGetInfo: total minus free), read in the device's primary context,
  the one TensorFlow and PyTorch use: it sees every allocation, the
  frameworks' pools and their contexts included."""
    found = _device(ordinal)
    if found is None:
        return None
    cuda, device = found
    context, popped = ctypes.c_void_p(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    try:
        if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device):
            return None
        try:
            if cuda.cuCtxPushCurrent_v2(context):
                return None
            try:
                if cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)):
                    return None
            finally:
                cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))
        finally:
            cuda.cuDevicePrimaryCtxRelease_v2(device)
    except AttributeError:
        return None
    return total.value - free.value
