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


def traced(run):
    """Runs `run(options, run_metadata)`, one graph-mode step that passes both
  to Session.run, once with RunOptions.FULL_TRACE.

  Returns:
    (wall ms of the step, its StepStats proto).
  """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    begin = time.perf_counter()
    run(options, metadata)
    return (time.perf_counter() - begin) * 1e3, metadata.step_stats


def profile(run, steps):
    """Runs `run(options, run_metadata)`, one graph-mode step that passes both
  to Session.run, `steps` times traced.

  Returns:
    (median wall ms of a traced step, {(kind, op type): ms a step}).
  """
    times, walls = collections.Counter(), []
    for _ in range(steps):
        wall, step_stats = traced(run)
        walls.append(wall)
        for device in step_stats.dev_stats:
            kind = device_kind(device.device)
            for node in device.node_stats:
                times[kind, op_type(node)] += node.all_end_rel_micros / 1e3 / steps
    return float(np.median(walls)), dict(times)


def top(times, count):
    """The `count` largest entries of profile()'s dict, as [kind, op, ms]."""
    ranked = sorted(times.items(), key=lambda item: -item[1])[:count]
    return [[kind, op, round(ms, 3)] for (kind, op), ms in ranked]


# Where xspace_step_stats() puts the TensorFlow ops the profiler saw run on
# the host (GPU ops' launches and CPU ops alike).
HOST_OPS_DEVICE = "/host:CPU/tf_ops"

# Stats of a profiler GPU event that name the TensorFlow op that launched it.
_OP_ANNOTATIONS = ("tf_op", "kernel_annotation", "level 0")


def xspace_step_stats(xspace):
    """TensorFlow's profiler record (an XSpace proto, the .xplane.pb that
  tf.profiler.experimental.stop() writes) as a StepStats proto, so that
  gpu_timeline() reads tf.function steps as it reads Session ones:

    each GPU stream line    -> "/device:GPU:N/stream:<line id>", a node per
                               event named "<op name>:<kernel>" (the op from
                               the event's annotation stat);
    each host "name:Type"   -> HOST_OPS_DEVICE, labelled "name = Type()".

  Returns:
    (StepStats, sorted stat names of GPU events that carried no op
    annotation: empty when every kernel was attributed).
  """
    from tensorflow.core.framework import step_stats_pb2  # pylint: disable=import-outside-toplevel
    stats, unattributed = step_stats_pb2.StepStats(), set()
    host_ops = None
    for plane in xspace.planes:
        stat_name = {key: value.name for key, value in plane.stat_metadata.items()}
        gpu = plane.name.startswith("/device:GPU:")
        if not gpu and plane.name != "/host:CPU":
            continue
        lines = plane.lines
        if gpu and any(line.name.startswith("Stream") for line in lines):
            # The streams alone: a GPU plane may also hold lines derived from them.
            lines = [line for line in lines if line.name.startswith("Stream")]
        for line in lines:
            if gpu:
                device = stats.dev_stats.add(device=f"{plane.name}/stream:{line.id}")
            for event in line.events:
                kernel = plane.event_metadata[event.metadata_id].name
                start_ns = line.timestamp_ns + event.offset_ps / 1e3
                if gpu:
                    op = _annotation(event, stat_name)
                    if op is None:
                        unattributed.update(
                            stat_name.get(stat.metadata_id, "?") for stat in event.stats)
                        op = "?"
                    node = device.node_stats.add(node_name=f"{op.split(':', 1)[0]}:{kernel}")
                else:
                    name, _, kind = kernel.partition(":")
                    if not name or not kind or " " in kind or "::" in kernel:
                        continue
                    if host_ops is None:
                        host_ops = stats.dev_stats.add(device=HOST_OPS_DEVICE)
                    node = host_ops.node_stats.add(node_name=name,
                                                   timeline_label=f"{name} = {kind}()")
                node.all_start_micros = int(start_ns / 1e3)
                node.all_end_rel_micros = int(event.duration_ps / 1e6)
    return stats, sorted(unattributed)


def trace_function(tf, run, steps):
    """Runs `run(s)` for s < steps (tf.function steps) under TensorFlow's
  profiler (tf.profiler.experimental, which a Session's RunOptions cannot
  reach) and reads its record back.

  Returns:
    xspace_step_stats()'s (StepStats, unattributed stat names), or None when
    the profiler wrote no .xplane.pb.
  """
    import glob  # pylint: disable=import-outside-toplevel
    import os  # pylint: disable=import-outside-toplevel
    import shutil  # pylint: disable=import-outside-toplevel
    import tempfile  # pylint: disable=import-outside-toplevel
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=import-outside-toplevel
    logdir = tempfile.mkdtemp(prefix="sok_ev_fn_trace_")
    try:
        tf.profiler.experimental.start(logdir)
        for s in range(steps):
            run(s)
        tf.profiler.experimental.stop()
        paths = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
        if not paths:
            return None
        xspace = xplane_pb2.XSpace()
        with open(paths[0], "rb") as f:
            xspace.ParseFromString(f.read())
        return xspace_step_stats(xspace)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def _annotation(event, stat_name):
    """The op annotation ("name:Type", its "#...#" suffix cut) of a profiler
  GPU event, or None."""
    for stat in event.stats:
        if stat_name.get(stat.metadata_id) in _OP_ANNOTATIONS:
            text = stat.str_value or stat_name.get(stat.ref_value, "")
            if text:
                return text.split("#", 1)[0]
    return None


def gpu_timeline(step_stats, gap_us=20.0):
    """The GPU's side of one traced step (a StepStats proto): when each op
  type's kernels ran, how busy the GPU was, and where it sat idle. Unlike
  profile()'s sums, this reads the critical path: the wall from the first
  kernel to the last, the union of kernel time within it, and the idle gaps
  longer than `gap_us` with the kernels on either side.

  Kernels are the nodes of "stream:N" devices ("stream:all" repeats them);
  each is attributed to an op by its node name's part before ':' when it has
  one (TensorFlow names a traced kernel "op_name:kernel").

  Returns:
    dict(span_ms, busy_ms, first_kernel_ms, ops={op: [first_ms, last_ms,
    kernels, kernel_ms]}, launches={op type: [first_ms, last_ms, nodes,
    ms]} (the GPU ops as their executor ran them on the host), gaps=[[at_ms,
    idle_ms, before, after]]), times relative to the step's first node.
  """
    nodes, kernels, launches, ops = [], [], {}, {}
    for device in step_stats.dev_stats:
        name = device.device.lower()
        kind = device_kind(device.device)
        for node in device.node_stats:
            start = node.all_start_micros
            end = start + max(node.all_end_rel_micros, 0)
            nodes.append(start)
            if "stream:" in name and "stream:all" not in name:
                kernels.append((start, end, node.node_name))
            elif kind == "GPU op" or device.device == HOST_OPS_DEVICE:
                _widen(launches, op_type(node), start, end)
    if not nodes:
        return dict(span_ms=0.0, busy_ms=0.0, first_kernel_ms=0.0, ops={}, launches={}, gaps=[])
    origin = min(nodes)
    kernels.sort()
    first = kernels[0][0] if kernels else origin
    reach, reach_name, busy, gaps = first, "", 0.0, []
    for start, end, name in kernels:
        if start - reach > gap_us:
            gaps.append([(reach - origin) / 1e3, (start - reach) / 1e3, reach_name, name])
        busy += max(0, end - max(start, reach))
        if end > reach:
            reach, reach_name = end, name
        _widen(ops, name.split(":", 1)[0], start, end)
    relative = lambda windows: {
        key: [(a - origin) / 1e3, (b - origin) / 1e3, n, ms]
        for key, (a, b, n, ms) in windows.items()
    }
    return dict(span_ms=(reach - first) / 1e3,
                busy_ms=busy / 1e3,
                first_kernel_ms=(first - origin) / 1e3,
                ops=relative(ops),
                launches=relative(launches),
                gaps=gaps)


def _widen(windows, key, start, end):
    """windows[key] = [first start, last end, nodes, ms summed] (us, us, count, ms)."""
    entry = windows.setdefault(key, [start, end, 0, 0.0])
    entry[0], entry[1] = min(entry[0], start), max(entry[1], end)
    entry[2] += 1
    entry[3] += (end - start) / 1e3


def print_timeline(timeline, label="", min_launch_ms=0.02):
    """Prints gpu_timeline()'s dict: the ops in the order their kernels
  started, the GPU ops' host time (those of at least min_launch_ms), then
  the gaps."""
    print(f"[timeline{label}] first kernel at {timeline['first_kernel_ms']:.3f} ms, kernels span "
          f"{timeline['span_ms']:.3f} ms, GPU busy {timeline['busy_ms']:.3f} ms")
    for op, (first, last, n, ms) in sorted(timeline["ops"].items(), key=lambda item: item[1][0]):
        print(f"[timeline{label}]   {first:8.3f} .. {last:8.3f} ms  {n:5d} kernels "
              f"{ms:7.3f} ms  {op}")
    for op, (first, last, n, ms) in sorted(timeline["launches"].items(),
                                           key=lambda item: item[1][0]):
        if ms >= min_launch_ms:
            print(f"[timeline{label}]   host {first:8.3f} .. {last:8.3f} ms  {n:5d} nodes "
                  f"{ms:7.3f} ms  {op}")
    for at, idle, before, after in timeline["gaps"]:
        print(f"[timeline{label}]   idle {idle:.3f} ms at {at:.3f}: {before} -> {after}")


def print_top(timeline, label, top=25):
    """gpu_timeline()'s dict, the largest first: the GPU's span and busy time,
  the `top` ops by kernel time, the GPU ops by host time (an op that waits
  on the host for its GPU work, or works on the host, shows there), and the
  10 longest idle gaps."""
    print(f"[trace {label}] kernels span {timeline['span_ms']:.2f} ms, GPU busy "
          f"{timeline['busy_ms']:.2f} ms, first kernel at {timeline['first_kernel_ms']:.2f} ms")
    for title, windows in (("kernels", timeline["ops"]), ("host", timeline["launches"])):
        for op, (first, last, count, ms) in sorted(windows.items(),
                                                   key=lambda item: -item[1][3])[:top]:
            print(f"[trace {label}]   {title} {ms:8.3f} ms {count:5d}x "
                  f"{first:8.2f} .. {last:8.2f} ms  {op[:160]}")
    for at, idle, before, after in sorted(timeline["gaps"], key=lambda gap: -gap[1])[:10]:
        print(f"[trace {label}]   idle {idle:.3f} ms at {at:.2f}: {before[:100]} -> {after[:100]}")


def save_and_print_timeline(step_stats, path, label=""):
    """Writes a traced step's StepStats proto to `path` (what this module's
  command line reads back) and prints its GPU timeline (print_timeline)."""
    with open(path, "wb") as f:
        f.write(step_stats.SerializeToString())
    print_timeline(gpu_timeline(step_stats), label)


if __name__ == "__main__":
    import sys  # pylint: disable=import-outside-toplevel
    from tensorflow.core.framework import step_stats_pb2  # pylint: disable=import-outside-toplevel
    for path in sys.argv[1:]:
        stats = step_stats_pb2.StepStats()
        with open(path, "rb") as f:
            stats.ParseFromString(f.read())
        print_timeline(gpu_timeline(stats), f" {path}")
