"""Build macros for sok-ev: the one place that owns compiler flags.

Every C++ and CUDA target goes through these macros so the framework-neutral
core, the CUDA objects and the TensorFlow op library are built with the same
ABI (-D flags come from tf.sysconfig via @local_tensorflow) and language level.
"""

load(
    "@local_tensorflow//:flags.bzl",
    "CUDA_ROOT",
    "TF_BUILT_WITH_CUDA",
    "TF_CUDA_VERSION",
    "TF_DEFINES",
    "TF_VERSION",
)

# Single source of the package version: the wheel name and python/setup.py
# both read it from here.
SOK_EV_VERSION = "0.1.0"

# The op library is tied to a TensorFlow build, not to a Python ABI.
SOK_EV_WHEEL = "sok_ev-%s-py3-none-linux_x86_64.whl" % SOK_EV_VERSION

SOK_EV_COPTS = [
    "-std=c++17",
    # -O3 vectorises the core's row loops (combine, optimizer updates):
    # benchmarks/cpu_sparse_step.py measured about 5% per step over -O2.
    "-O3",
    "-fPIC",
    "-Wall",
    "-Wextra",
    # Kernel and op signatures are fixed by TensorFlow; unused ones are normal.
    "-Wno-unused-parameter",
    # TF 2.21 marks its everyday kernel API (errors::InvalidArgument,
    # ThreadPool::ParallelFor, ...) deprecated; hundreds of such lines per
    # build would bury real errors.
    "-Wno-deprecated-declarations",
    # The optimizer and initializer arithmetic is shared with the CUDA twin
    # (built with -fmad=false); no fused multiply-add keeps both bit-equal.
    "-ffp-contract=off",
    # sqrtf without the errno branch, so the optimizer's row loops vectorise;
    # the results are the same correctly rounded square roots.
    "-fno-math-errno",
] + TF_DEFINES

# tf.load_op_library runs after TensorFlow is imported, so the framework is
# already loaded; the rpath covers loading the .so from an installed wheel
# (site-packages/sok_ev/ next to site-packages/tensorflow/) without TF first.
# --no-undefined: a kernel calling a core function nobody defines fails the
# link here instead of tf.load_op_library on a user's machine.
_OP_LINKOPTS = ["-Wl,-rpath,$$ORIGIN/../tensorflow", "-Wl,--no-undefined"]

# GPU machine code for Ampere (sm_80; the same cubin runs on sm_86/sm_89) and
# Hopper (sm_90), and sm_90 PTX that the driver compiles for newer GPUs.
SOK_EV_CUDA_ARCHS = ["sm_80", "sm_90"]
SOK_EV_CUDA_PTX = "sm_90"

# CUDA sources are compiled by the CUDA root's clang++ against its CUDA 12
# (see addons/cuda_root.py): host and device code in one pass.
_CUDA_FLAGS = [
    "-x",
    "cuda",
    "-std=c++17",
    "-O3",
    "-fPIC",
    "--cuda-path=" + CUDA_ROOT,
    "--cuda-include-ptx=" + SOK_EV_CUDA_PTX,
    # Bit-equal with the CPU twin (see -ffp-contract=off above); nvcc calls
    # this -fmad=false. No flush-to-zero and IEEE division and square root,
    # as nvcc's defaults.
    "-ffp-contract=off",
    "-fno-gpu-flush-denormals-to-zero",
    "-fno-gpu-approx-transcendentals",
    # The fatbin bundler is CUDA 13's; uncompressed images keep it readable by
    # CUDA 12 drivers.
    "-Xcuda-fatbinary",
    "--compress=false",
] + ["--cuda-gpu-arch=" + arch for arch in SOK_EV_CUDA_ARCHS] + TF_DEFINES

# The op library's own preprocessor flags in a GPU build: TensorFlow's
# headers expose their GPU device types only with these.
_TF_GPU_DEFINES = ["-DGOOGLE_CUDA=1", "-DEIGEN_USE_GPU"]

_CUDA = "//addons:cuda"

NEEDS_CUDA_TENSORFLOW = ("--config=cuda needs a CUDA-enabled TensorFlow in the venv " +
                         "(SOK_EV_TF_PACKAGE=tensorflow==2.21.0 bash request.sh); " +
                         "TensorFlow %s is a CPU build") % TF_VERSION

def _config_error_impl(ctx):
    fail(ctx.attr.message)

# A dependency that stops the analysis with `message`: a build configuration
# that cannot work says why instead of failing at link or load time.
config_error = rule(
    implementation = _config_error_impl,
    attrs = {"message": attr.string()},
)

def if_cuda(value):
    """`value` in a GPU build (--config=cuda), [] otherwise."""
    return select({_CUDA: value, "//conditions:default": []})

def _matching_tensorflow():
    """Deps that stop a build whose configuration does not fit TensorFlow.

    A CUDA-enabled TensorFlow needs --config=cuda (bash request.sh passes
    it); a CPU TensorFlow cannot link a GPU build.
    """
    if TF_BUILT_WITH_CUDA:
        return select(
            {_CUDA: []},
            no_match_error = ("TensorFlow %s is a CUDA build: build with --config=cuda " +
                              "(bash request.sh does)") % TF_VERSION,
        )
    return if_cuda(["//addons:cuda_needs_cuda_tensorflow"])

def sok_ev_cc_library(name, copts = [], **kwargs):
    """A cc_library compiled with the project flags."""
    native.cc_library(
        name = name,
        copts = SOK_EV_COPTS + copts,
        **kwargs
    )

def sok_ev_op_library(name, srcs, deps = [], gpu_deps = [], copts = [], **kwargs):
    """A TensorFlow custom-op shared library (name should end in .so).

    Linked against libtensorflow_framework from @local_tensorflow. A GPU build
    (--config=cuda, required with a CUDA-enabled TensorFlow) compiles `srcs`
    with GOOGLE_CUDA and links `gpu_deps` (the CUDA core, the CUDA runtime).
    """
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + ["@local_tensorflow//:tf"] + _matching_tensorflow() + if_cuda(
            gpu_deps + ["@local_tensorflow//:cuda_headers"],
        ),
        copts = SOK_EV_COPTS + copts + if_cuda(_TF_GPU_DEFINES),
        # libcudart.so.12 is TensorFlow's own dependency: pip installs it in
        # site-packages/nvidia/cuda_runtime/lib, beside site-packages/sok_ev.
        linkopts = _OP_LINKOPTS + if_cuda(["-Wl,-rpath,$$ORIGIN/../nvidia/cuda_runtime/lib"]),
        linkshared = 1,
        **kwargs
    )
def _cuda_objects_impl(ctx):
    if not TF_BUILT_WITH_CUDA:
        fail(NEEDS_CUDA_TENSORFLOW)
    if not CUDA_ROOT:
        fail(("TensorFlow %s has no CUDA root in its venv (<venv>/cuda): run `bash request.sh`, " +
              "which installs the CUDA %s packages and assembles it") % (TF_VERSION, TF_CUDA_VERSION))
    compilation = [dep[CcInfo].compilation_context for dep in ctx.attr.deps]
    headers = depset(ctx.files.hdrs, transitive = [c.headers for c in compilation])

    include_flags = ["-I."]
    for c in compilation:
        for d in c.includes.to_list() + c.quote_includes.to_list() + c.system_includes.to_list():
            include_flags.append("-I" + d)
        include_flags += ["-D" + d for d in c.defines.to_list()]

    objects = []
    for src in ctx.files.srcs:
        # Keep the package-relative path so same-named files in
        # subdirectories cannot collide.
        rel = src.short_path[len(ctx.label.package) + 1:] if ctx.label.package else src.short_path
        obj = ctx.actions.declare_file("_cuda/%s/%s.pic.o" % (ctx.label.name, rel.rsplit(".", 1)[0]))
        ctx.actions.run_shell(
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            command = 'exec "$@"',
            arguments = [CUDA_ROOT + "/bin/clang++"] + _CUDA_FLAGS + ctx.attr.cuda_flags +
                        include_flags + ["-c", src.path, "-o", obj.path],
            mnemonic = "CudaCompile",
            progress_message = "Compiling CUDA %s" % src.short_path,
            # clang runs ptxas and fatbinary from --cuda-path, the host
            # assembler and linker from PATH.
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "cuda_flags": attr.string_list(),
    },
)

def sok_ev_cuda_library(name, srcs, hdrs = [], deps = [], cuda_flags = [], **kwargs):
    """A cc_library of .cu files compiled for the GPU, under --config=cuda only.

    Without that configuration the library is empty, so CPU builds never need
    a CUDA compiler or a GPU; an empty srcs list is fine too. The CUDA root
    (compiler, CUDA 12 headers, libcudart.so.12) is the venv's, found by
    @local_tensorflow.
    """
    _cuda_objects(
        name = name + "_cuda",
        srcs = if_cuda(srcs),
        hdrs = hdrs,
        deps = deps,
        cuda_flags = cuda_flags,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [name + "_cuda"],
        hdrs = hdrs,
        deps = deps,
        # The shared CUDA runtime, not libcudart_static: TensorFlow loads
        # libcudart.so.12 itself, so the op library shares its one runtime (the
        # user's, any 12.x from the 12.5 it is built with up) instead of
        # bringing a second; PyPI's CUDA 12.5 runtime has no static library.
        linkopts = if_cuda(["-L%s/lib64" % CUDA_ROOT, "-l:libcudart.so.12"]),
        **kwargs
    )

def sok_ev_build_info(name):
    """Writes `name` (JSON): the TensorFlow and CUDA the op library is built for.

    sok_ev/_ops.py names them when the library fails to load, and the device
    test log shows which artifact it ran.
    """
    cpu = {"tensorflow": TF_VERSION, "cuda": None}
    gpu = dict(cpu, cuda = TF_CUDA_VERSION, cuda_archs = SOK_EV_CUDA_ARCHS, cuda_ptx = SOK_EV_CUDA_PTX)
    native.genrule(
        name = name.replace(".", "_"),
        outs = [name],
        cmd = select({
            _CUDA: "echo '%s' >$@" % json.encode(gpu),
            "//conditions:default": "echo '%s' >$@" % json.encode(cpu),
        }),
    )
