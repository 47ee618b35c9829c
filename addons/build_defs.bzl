"""Build macros for sok-ev: the one place that owns compiler flags.

Every C++ and CUDA target goes through these macros so the framework-neutral
core, the CUDA objects and the TensorFlow op library are built with the same
ABI (-D flags come from tf.sysconfig via @local_tensorflow) and language level.
"""

load("@local_tensorflow//:flags.bzl", "TF_DEFINES")

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
_OP_LINKOPTS = ["-Wl,-rpath,$$ORIGIN/../tensorflow"]

_NVCC_FLAGS = [
    "-std=c++17",
    "-O2",
    "-gencode=arch=compute_90,code=sm_90",
    # Bit-equal with the CPU twin (see -ffp-contract=off above).
    "-fmad=false",
    "-Xcompiler",
    "-fPIC",
    "--expt-relaxed-constexpr",
] + TF_DEFINES

_CUDA = "//addons:cuda"

def sok_ev_cc_library(name, copts = [], **kwargs):
    """A cc_library compiled with the project flags."""
    native.cc_library(
        name = name,
        copts = SOK_EV_COPTS + copts,
        **kwargs
    )

def sok_ev_op_library(name, srcs, deps = [], copts = [], **kwargs):
    """A TensorFlow custom-op shared library (name should end in .so).

    Linked against libtensorflow_framework from @local_tensorflow. Under
    --config=cuda it also links //cc:core_gpu and defines SOK_EV_WITH_CUDA.
    """
    native.cc_binary(
        name = name,
        srcs = srcs,
        deps = deps + ["@local_tensorflow//:tf"] + select({
            _CUDA: ["//cc:core_gpu"],
            "//conditions:default": [],
        }),
        copts = SOK_EV_COPTS + copts + select({
            _CUDA: ["-DSOK_EV_WITH_CUDA=1"],
            "//conditions:default": [],
        }),
        linkopts = _OP_LINKOPTS,
        linkshared = 1,
        **kwargs
    )

def _nvcc_objects_impl(ctx):
    nvcc = ctx.var.get("SOK_EV_CUDA_HOME", "/usr/local/cuda") + "/bin/nvcc"
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
        obj = ctx.actions.declare_file("_nvcc/%s/%s.pic.o" % (ctx.label.name, rel.rsplit(".", 1)[0]))
        ctx.actions.run_shell(
            inputs = depset([src], transitive = [headers]),
            outputs = [obj],
            command = 'exec "$@"',
            arguments = [nvcc] + ctx.attr.nvcc_flags + include_flags + ["-c", src.path, "-o", obj.path],
            mnemonic = "Nvcc",
            progress_message = "Compiling CUDA %s" % src.short_path,
            # nvcc runs the host compiler found on PATH.
            use_default_shell_env = True,
        )
        objects.append(obj)
    return [DefaultInfo(files = depset(objects))]

_nvcc_objects = rule(
    implementation = _nvcc_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = True),
        "deps": attr.label_list(providers = [CcInfo]),
        "nvcc_flags": attr.string_list(),
    },
)

def sok_ev_cuda_library(name, srcs, hdrs = [], deps = [], nvcc_flags = [], **kwargs):
    """A cc_library of .cu files compiled by nvcc, under --config=cuda only.

    Without that configuration the library is empty, so CPU builds never need
    nvcc or a GPU; an empty srcs list is fine too. The CUDA root (nvcc and
    libcudart) is --define=SOK_EV_CUDA_HOME, set by .bazelrc's config:cuda.
    """
    _nvcc_objects(
        name = name + "_nvcc",
        srcs = select({_CUDA: srcs, "//conditions:default": []}),
        hdrs = hdrs,
        deps = deps,
        nvcc_flags = _NVCC_FLAGS + nvcc_flags,
        visibility = ["//visibility:private"],
    )
    native.cc_library(
        name = name,
        srcs = [name + "_nvcc"],
        hdrs = hdrs,
        deps = deps,
        linkopts = select({
            _CUDA: ["-L$(SOK_EV_CUDA_HOME)/lib64", "-lcudart"],
            "//conditions:default": [],
        }),
        **kwargs
    )
