"""Where a graph-mode training step's time goes, from TensorFlow's own step
stats (RunOptions.FULL_TRACE): per op type, the sum over its nodes of start to
end, in ms a step. Used by cpu_sparse_step.py --profile and
gpu/tf_weak_scaling.py.

The device a node ran on is reduced to a kind:
  "CPU"          a CPU op, start to end on its thread;
  "GPU op"       an op of a GPU device as its executor saw it: launch time for
                 a kernel, the whole wait for an asynchronous op (a Horovod
                 collective from enqueue to done, negotiation included);
  "GPU kernels"  the kernels themselves, when CUPTI traced the GPU's streams.
Sums over nodes count overlapping time more than once: they say where the
work is, not the critical path.
"""
import collections
import time

import numpy as np


def device_kind(device):
    """The kind ("CPU", "GPU op", "GPU kernels") of a step-stats device name
  such as "/job:localhost/replica:0/task:0/device:GPU:0" or
  "/device:GPU:0/stream:all"."""
    name = device.lower()
    if "gpu" not in name:
        return "CPU"
    return "GPU kernels" if "stream" in name else "GPU op"


def op_type(node):
    """A node's op type, read from its timeline label ("name = Type(inputs)");
  the node name where the label has none (kernels traced by CUPTI)."""
    label = node.timeline_label
    return label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else node.node_name


def profile(run, steps):
    """Runs `run(options, run_metadata)`, one graph-mode step that passes both
  to Session.run, `steps` times traced.

  Returns:
    (median wall ms of a traced step, {(kind, op type): ms a step}).
  """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    times, walls = collections.Counter(), []
    for _ in range(steps):
        metadata = tf.compat.v1.RunMetadata()
        begin = time.perf_counter()
        run(options, metadata)
        walls.append((time.perf_counter() - begin) * 1e3)
        for device in metadata.step_stats.dev_stats:
            kind = device_kind(device.device)
            for node in device.node_stats:
                times[kind, op_type(node)] += node.all_end_rel_micros / 1e3 / steps
    return float(np.median(walls)), dict(times)


def top(times, count):
    """The `count` largest entries of profile()'s dict, as [kind, op, ms]."""
    ranked = sorted(times.items(), key=lambda item: -item[1])[:count]
    return [[kind, op, round(ms, 3)] for (kind, op), ms in ranked]
