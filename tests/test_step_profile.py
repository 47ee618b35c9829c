"""benchmarks/step_profile.py reads a tf.function step from TensorFlow's
profiler (an XSpace) as it reads a Session step (StepStats): each kernel is
attributed to the op its annotation names, host op events become launches,
and the timeline's busy time, span and gaps follow the kernels' times."""
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from benchmarks import step_profile


def _event(plane, line, name, start_us, duration_us, stats=()):
    metadata_id = len(plane.event_metadata) + 1
    plane.event_metadata[metadata_id].id = metadata_id
    plane.event_metadata[metadata_id].name = name
    event = line.events.add(metadata_id=metadata_id,
                            offset_ps=int(start_us * 1e6),
                            duration_ps=int(duration_us * 1e6))
    for stat_name, text in stats:
        stat_id = len(plane.stat_metadata) + 1
        plane.stat_metadata[stat_id].id = stat_id
        plane.stat_metadata[stat_id].name = stat_name
        event.stats.add(metadata_id=stat_id, str_value=text)


def _space():
    space = xplane_pb2.XSpace()
    gpu = space.planes.add(name="/device:GPU:0")
    stream = gpu.lines.add(id=7, name="Stream #7(Compute)", timestamp_ns=1_000_000)
    _event(gpu, stream, "unique_kernel", 10, 5,
           [("tf_op", "lookup/SokEv>UniqueKeys:SokEv>UniqueKeys")])
    _event(gpu, stream, "apply_kernel", 40, 20, [("tf_op", "update/SokEv>Apply:SokEv>Apply#id=3#")])
    _event(gpu, stream, "mystery_kernel", 61, 1, [("correlation_id", "9")])
    derived = gpu.lines.add(id=99, name="TensorFlow Ops", timestamp_ns=1_000_000)
    _event(gpu, derived, "lookup/SokEv>UniqueKeys", 10, 5)
    host = space.planes.add(name="/host:CPU")
    thread = host.lines.add(id=1, name="tf_inter_op", timestamp_ns=1_000_000)
    _event(host, thread, "lookup/SokEv>UniqueKeys:SokEv>UniqueKeys", 2, 9)
    _event(host, thread, "ExecutorState::Process", 0, 70)
    return space


def test_kernels_are_attributed_to_the_op_their_annotation_names():
    stats, unattributed = step_profile.xspace_step_stats(_space())
    timeline = step_profile.gpu_timeline(stats, gap_us=10.0)
    assert set(timeline["ops"]) == {"lookup/SokEv>UniqueKeys", "update/SokEv>Apply", "?"}
    # A kernel without an annotation is reported with the stats it had.
    assert unattributed == ["correlation_id"]
    first, last, kernels, ms = timeline["ops"]["update/SokEv>Apply"]
    assert kernels == 1 and abs(ms - 0.020) < 1e-9 and abs(last - first - ms) < 1e-9


def test_the_timeline_reads_busy_time_span_and_gaps_from_the_stream_lines_alone():
    timeline = step_profile.gpu_timeline(step_profile.xspace_step_stats(_space())[0], gap_us=10.0)
    # Kernels at 10-15, 40-60, 61-62 us: the derived "TensorFlow Ops" line is
    # not counted again.
    assert abs(timeline["busy_ms"] - 0.026) < 1e-9
    assert abs(timeline["span_ms"] - 0.052) < 1e-9
    assert [round(idle, 3) for _, idle, _, _ in timeline["gaps"]] == [0.025]


def test_host_op_events_become_launches_and_other_host_events_are_left_out():
    timeline = step_profile.gpu_timeline(step_profile.xspace_step_stats(_space())[0])
    assert list(timeline["launches"]) == ["SokEv>UniqueKeys"]
    first, last, nodes, ms = timeline["launches"]["SokEv>UniqueKeys"]
    assert nodes == 1 and abs(ms - 0.009) < 1e-9
