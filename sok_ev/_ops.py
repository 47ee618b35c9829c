"""Loads sok-ev's TensorFlow op library (`_sok_ev_ops.so`) once, on first use.

Every other module reaches the native ops through `ops()`, so importing
`sok_ev` never fails on a broken build; the first call that needs an op does,
with a message naming the TensorFlow and CUDA the library was built for, what
is installed, and the fix.
"""

import json
import os

import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # pylint: disable=no-name-in-module

_HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY_PATH = os.path.join(_HERE, "_sok_ev_ops.so")
_BUILD_INFO_PATH = os.path.join(_HERE, "_build_info.json")  # written by the build
_library = None


def build_info():
    """What the op library was built for, as the build recorded it.

  Returns:
    A dict: "tensorflow" (version string), "cuda" (the CUDA version of a GPU
    build, None for a CPU build) and, for a GPU build, "cuda_archs" (GPU
    machine code, e.g. ["sm_80", "sm_90"]) and "cuda_ptx" (the PTX target).
    An empty dict when the file is missing (a build from before it existed).
  """
    if not os.path.exists(_BUILD_INFO_PATH):
        return {}
    with open(_BUILD_INFO_PATH) as f:
        return json.load(f)


def describe_build(info):
    """One line naming the TensorFlow and CUDA of a build_info() dict."""
    if not info:
        return "an unknown TensorFlow (no _build_info.json)"
    if not info.get("cuda"):
        return f"TensorFlow {info['tensorflow']}, CPU only"
    return (f"TensorFlow {info['tensorflow']} with CUDA {info['cuda']} "
            f"(GPU code for {', '.join(info['cuda_archs'])}, PTX {info['cuda_ptx']})")


def _installed_cuda():
    """The CUDA version of the installed TensorFlow, None for a CPU build."""
    if not tf.test.is_built_with_cuda():
        return None
    return tf.sysconfig.get_build_info().get("cuda_version")


def ops():
    """Returns the loaded op module (its functions are `sok_ev_<op_name>`).

  Raises:
    ImportError: the library is missing or cannot be loaded by the installed
      TensorFlow (another TensorFlow, or a GPU build without the CUDA 12
      runtime). The message says what it was built for and what is installed.
    ValueError: called while a function compiled by XLA is traced (see
      `_refuse_xla`), before any op is built.
  """
    _refuse_xla()
    global _library
    if _library is None:
        try:
            _library = tf.load_op_library(LIBRARY_PATH)
        except (tf.errors.NotFoundError, OSError) as error:
            info = build_info()
            cuda = _installed_cuda()
            installed = f"TensorFlow {tf.__version__}" + (f" with CUDA {cuda}"
                                                          if cuda else ", a CPU build,")
            hint = "Rebuild and reinstall with `bash request.sh`."
            if info.get("cuda") and cuda and "libcudart" in str(error):
                major = info["cuda"].split(".")[0]
                hint = (f"It needs the CUDA {major} runtime libcudart.so.{major}: "
                        f"pip install nvidia-cuda-runtime-cu{major} (tensorflow[and-cuda] "
                        "brings it), or rebuild and reinstall with `bash request.sh`.")
            raise ImportError(f"sok_ev could not load its op library {LIBRARY_PATH}: {error}\n"
                              f"It was built for {describe_build(info)}; {installed} is "
                              f"installed. {hint}") from error
    return _library


def _refuse_xla():
    """Raises ValueError when the graph being built is compiled by XLA.

  sok-ev's kernels have no XLA form. Without this check the failure comes
  when the step first runs, as TensorFlow's "no registered OpKernel for
  XLA_GPU_JIT" over the whole function. Keras makes that the default on a
  GPU: `compile(jit_compile="auto")` picks XLA there when every layer
  supports it (sok-ev's own layers refuse it; a user's layer that calls
  sok-ev does not), while on a CPU-only machine it never does.
  """
    if tf.executing_eagerly():
        return
    graph = tf.compat.v1.get_default_graph()
    if control_flow_util.GraphOrParentsInXlaContext(graph):
        raise ValueError(
            f"sok_ev's ops cannot be compiled by XLA, and {graph.name!r} is being compiled "
            "with jit_compile=True. Build it without XLA: tf.function(jit_compile=False); in "
            "Keras, model.compile(jit_compile=False), or set `self.supports_jit = False` in "
            "the layer that calls sok_ev (on a GPU, Keras's default jit_compile='auto' picks "
            "XLA when every layer supports it; sok_ev's own layers do not).")


def host_memory_input(value, dtype):
    """`value` as an op input that the GPU kernels read in host memory
  (`.HostMemory(...)` in their registration: dense shapes, optimizer
  hyperparameters, the step).

  A value known when the graph is built becomes a constant on the CPU. Left
  to the placer, its constant would sit on the GPU beside the op and be
  copied back to the host, a wait on the GPU, in every step. Any other value
  passes through (cast to `dtype`). The constant leaves any colocation in
  force (optimizers build updates colocated with the variable): colocated
  with a GPU variable it could not be placed, and it must never pull a
  variable's group to the CPU.

  Args:
    value: a tensor or anything tf.convert_to_tensor takes.
    dtype: the input's dtype.

  Returns:
    A tensor of `dtype`.
  """
    static = tf.get_static_value(value)
    if static is None:
        return tf.cast(value, dtype)
    with tf.compat.v1.colocate_with(None, ignore_existing=True), tf.device("/device:CPU:0"):
        return tf.constant(static, dtype)
