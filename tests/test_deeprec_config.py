"""DeepRec's ConfigProto fields after sok_ev.install_deeprec_api()
(sok_ev/deeprec_config.py).

DeepRec's modelzoo scripts set
`sess_config.graph_options.optimizer_options.do_smart_stage` (and
`do_op_fusion`, `micro_batch_num`), fields stock TensorFlow's protobuf
rejects. Pinned down:
* tf.compat.v1.ConfigProto() takes them, reads them back, and keeps them out
  of the stock ConfigProto TensorFlow receives, whose own fields are those set;
* Session, ChiefSessionCreator and MonitoredTrainingSession take such a
  config and receive exactly its stock ConfigProto;
* a DeepRec field of the wrong kind is refused naming the field and value,
  leaving the config as it was; unknown fields still raise as in TensorFlow;
* isinstance against tf.compat.v1.ConfigProto holds for stock protos too.
"""
import copy

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2


@pytest.fixture(scope="module")
def deeprec(sok):
    sok.install_deeprec_api()
    return tf.compat.v1


def _modelzoo_config(deeprec):
    # What DeepRec's modelzoo main() builds (dlrm/wide_and_deep/deepfm).
    config = deeprec.ConfigProto()
    config.inter_op_parallelism_threads = 2
    config.intra_op_parallelism_threads = 1
    config.graph_options.optimizer_options.do_smart_stage = True
    config.graph_options.optimizer_options.do_op_fusion = True
    config.graph_options.optimizer_options.micro_batch_num = 4
    return config


def _expected_stock_proto():
    return config_pb2.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=1)


def test_deeprec_optimizer_fields_read_back_and_stay_out_of_the_stock_proto(deeprec):
    config = _modelzoo_config(deeprec)
    options = config.graph_options.optimizer_options
    set_fields = (options.do_smart_stage, options.do_op_fusion, options.micro_batch_num)
    assert set_fields == (True, True, 4)
    assert options.do_smart_stage_gpu is False  # unset: proto3's default
    assert type(config.proto) is config_pb2.ConfigProto
    assert config.proto == _expected_stock_proto()


def test_stock_fields_set_through_the_config_reach_its_stock_proto(deeprec):
    config = deeprec.ConfigProto(allow_soft_placement=True)
    config.graph_options.optimizer_options.opt_level = config_pb2.OptimizerOptions.L0
    config.graph_options.place_pruned_graph = True
    config.device_filters.append("/job:ps")
    expected = config_pb2.ConfigProto(allow_soft_placement=True, device_filters=["/job:ps"])
    expected.graph_options.optimizer_options.opt_level = config_pb2.OptimizerOptions.L0
    expected.graph_options.place_pruned_graph = True
    assert config.proto == expected


def test_session_receives_the_stock_proto_and_runs(deeprec):
    config = _modelzoo_config(deeprec)
    with tf.Graph().as_default():
        total = tf.constant(2.0) + tf.constant(3.0)
        with deeprec.Session(config=config) as sess:
            assert sess._config is config.proto  # pylint: disable=protected-access
            assert sess.run(total) == 5.0


def test_chief_session_creator_and_monitored_training_session_take_it(deeprec):
    config = _modelzoo_config(deeprec)
    with tf.Graph().as_default():
        step = deeprec.train.get_or_create_global_step()
        increment = deeprec.assign_add(step, 1)
        with deeprec.train.MonitoredTrainingSession(config=config) as sess:
            sess.run(increment)
            sess.run(increment)
        creator = deeprec.train.ChiefSessionCreator(config=config)
        with deeprec.train.MonitoredSession(session_creator=creator) as sess:
            assert sess.run(increment) == 1  # a fresh session: the step starts at 0 again


# TensorFlow's Session.__del__ complains about the session it never made.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_session_still_refuses_what_is_not_a_config(deeprec):
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match="config"):
            deeprec.Session(config="intra_op_parallelism_threads: 1")


@pytest.mark.parametrize("field, value, error", [
    ("do_smart_stage", "yes", TypeError),
    ("do_op_fusion", 1.0, TypeError),
    ("micro_batch_num", True, TypeError),
    ("micro_batch_num", 2.5, TypeError),
    ("micro_batch_num", -1, ValueError),
    ("micro_batch_num", 2**31, ValueError),
])
def test_a_deeprec_field_of_the_wrong_kind_is_refused_naming_it(deeprec, field, value, error):
    config = _modelzoo_config(deeprec)
    options = config.graph_options.optimizer_options
    before = options.deeprec_fields
    with pytest.raises(error, match=rf"OptimizerOptions\.{field} .*{repr(value)[:4]}"):
        setattr(options, field, value)
    assert options.deeprec_fields == before


def test_unknown_fields_still_raise_as_in_tensorflow(deeprec):
    config = deeprec.ConfigProto()
    with pytest.raises(AttributeError, match="no_such_field"):
        config.graph_options.optimizer_options.no_such_field = 1
    with pytest.raises(AttributeError, match="no_such_field"):
        config.no_such_field = 1
    with pytest.raises(ValueError, match="no_such_field"):
        deeprec.ConfigProto(no_such_field=1)


def test_isinstance_holds_for_both_kinds_of_config(deeprec):
    assert isinstance(deeprec.ConfigProto(), deeprec.ConfigProto)
    assert isinstance(config_pb2.ConfigProto(), deeprec.ConfigProto)
    assert not isinstance(config_pb2.GraphOptions(), deeprec.ConfigProto)
    assert deeprec.ConfigProto.DESCRIPTOR is config_pb2.ConfigProto.DESCRIPTOR
    assert tf.ConfigProto is deeprec.ConfigProto


def test_a_deep_copy_keeps_deeprec_fields_and_is_independent(deeprec):
    config = _modelzoo_config(deeprec)
    duplicate = copy.deepcopy(config)
    assert duplicate == config
    duplicate.graph_options.optimizer_options.micro_batch_num = 8
    duplicate.intra_op_parallelism_threads = 3
    assert config.graph_options.optimizer_options.micro_batch_num == 4
    assert config.proto == _expected_stock_proto()
