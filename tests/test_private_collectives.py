"""sok-ev's private collectives (the stop message of sok_ev/agreement.py,
allgather_object) run in a session of their own. Their inputs are constants,
and Horovod's collectives are not stateful: TensorFlow would fold such a node
while optimizing the graph, running it on the CPU outside the session, where
a GPU exchange on another worker cannot pair with it. These tests pin that
the private session runs constant-fed nodes itself, with TensorFlow's default
session (which folds them) as the reference."""
import tensorflow as tf

from sok_ev import communication


def _ran_in_session(config):
    """Whether a node fed only by constants ran in the session (shows in its
  step stats) or was folded away before, and the value it gave."""
    with tf.Graph().as_default():
        total = tf.add(tf.constant(2), tf.constant(3), name="constant_fed")
        with tf.compat.v1.Session(config=config) as session:
            metadata = tf.compat.v1.RunMetadata()
            value = session.run(
                total,
                options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                run_metadata=metadata)
    names = {
        node.node_name for device in metadata.step_stats.dev_stats for node in device.node_stats
    }
    return "constant_fed" in names, value


def test_tensorflows_default_session_folds_a_constant_fed_node():
    ran, value = _ran_in_session(tf.compat.v1.ConfigProto())
    assert value == 5
    assert not ran, "the reference no longer folds: the test below proves nothing"


def test_a_private_session_runs_a_constant_fed_node_itself():
    for device in (None, "/CPU:0"):
        ran, value = _ran_in_session(communication._private_session_config(device))  # pylint: disable=protected-access
        assert value == 5
        assert ran, f"folded with device={device!r}"


def test_a_private_session_places_exactly_on_a_named_device_and_softly_otherwise():
    assert not communication._private_session_config("/GPU:0").allow_soft_placement  # pylint: disable=protected-access
    assert communication._private_session_config(None).allow_soft_placement  # pylint: disable=protected-access
