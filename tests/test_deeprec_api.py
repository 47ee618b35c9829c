"""DeepRec's Embedding Variable API after sok_ev.install_deeprec_api().

Pinned down:
* every name DeepRec scripts touch exists on tf and tf.compat.v1 (options,
  filters, eviction, storage, GraphKeys, config_pb2), with DeepRec's
  constructor arguments, defaults and argument checks;
* feature filters and L2WeightEvict are accepted;
* options sok-ev does not implement yet can be created, and
  get_embedding_variable refuses them with a ValueError naming the feature,
  before anything is created;
* a DeepRec script's set-up (EV_INIT_VAR_OPS, EV_INIT_SLOT_OPS, then
  global_variables_initializer) runs;
* install_deeprec_api() alone is all a one-worker DeepRec script needs: it
  trains with a stock optimizer and saves and restores with
  tf.compat.v1.train.Saver;
* an initializer may be passed as a class, as DeepRec's tests do
  (`initializer=init_ops.ones_initializer`), directly or in InitializerOption.
"""
import importlib

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

DIM = 4
DEEPREC_NAMES = ("get_embedding_variable", "EmbeddingVariableOption", "InitializerOption",
                 "GlobalStepEvict", "L2WeightEvict", "CounterFilter", "CBFFilter", "StorageOption",
                 "CheckpointOption", "StorageType", "CacheType")


@pytest.fixture(scope="module")
def deeprec(sok):
    sok.install_deeprec_api()
    return tf.compat.v1


# --------------------------------------------------------------------------- names and defaults


@pytest.mark.parametrize("name", DEEPREC_NAMES)
def test_deeprec_names_exist_on_tf_and_tf_compat_v1(deeprec, name):
    assert getattr(tf, name) is getattr(deeprec, name)


@pytest.mark.parametrize("name", [
    "categorical_column_with_embedding", "embedding_column", "shared_embedding_columns",
    "input_layer", "group_embedding_column_scope", "categorical_column_with_adaptive_embedding"
])
def test_deeprec_feature_column_names_exist_on_both_feature_column_modules(deeprec, name):
    from sok_ev import feature_column  # pylint: disable=import-outside-toplevel
    assert getattr(tf.feature_column, name) is feature_column.FEATURE_COLUMN_NAMES[name]
    assert getattr(tf.compat.v1.feature_column, name) is feature_column.FEATURE_COLUMN_NAMES[name]


def test_deeprec_group_lookup_and_stock_training_names_are_installed(deeprec):
    from sok_ev import deeprec_session, feature_column, incremental_saver  # pylint: disable=import-outside-toplevel
    for nn in (tf.nn, tf.compat.v1.nn):
        assert nn.group_embedding_lookup_sparse is feature_column.group_embedding_lookup_sparse
    assert tf.compat.v1.train.Saver is incremental_saver.StockNameSaver
    assert tf.compat.v1.train.MonitoredTrainingSession is deeprec_session.MonitoredTrainingSession


def test_deeprec_graph_keys_exist(deeprec):
    keys = deeprec.GraphKeys
    assert keys.EV_INIT_VAR_OPS == "ev_init_var_ops"
    assert keys.EV_INIT_SLOT_OPS == "ev_init_slot_ops"
    assert isinstance(keys.EMBEDDING_VARIABLES, str)


def test_deeprec_config_pb2_module_can_be_imported(deeprec):
    config_pb2 = importlib.import_module("tensorflow.core.framework.embedding.config_pb2")
    assert config_pb2.StorageType.DRAM_SSDHASH == 12
    assert config_pb2.StorageType is deeprec.StorageType
    assert config_pb2.CacheType.LFU == 1


def test_install_deeprec_api_is_idempotent(sok, deeprec):
    sok.install_deeprec_api()
    assert deeprec.CounterFilter is sok.CounterFilter


def test_option_classes_take_deeprecs_arguments_and_defaults(deeprec):
    # DeepRec's signatures (tensorflow/python/ops/variables.py), positionally.
    assert deeprec.CounterFilter().filter_freq == 0
    assert deeprec.CounterFilter(3).filter_freq == 3
    cbf = deeprec.CBFFilter()
    assert (cbf.filter_freq, cbf.max_element_size, cbf.false_positive_probability,
            cbf.counter_type) == (0, 0, -1.0, tf.uint64)
    cbf = deeprec.CBFFilter(3, 2**30, 0.01, tf.int64)
    assert (cbf.filter_freq, cbf.max_element_size, cbf.false_positive_probability,
            cbf.counter_type) == (3, 2**30, 0.01, tf.int64)
    assert deeprec.L2WeightEvict().l2_weight_threshold == -1.0
    assert deeprec.GlobalStepEvict().steps_to_live is None
    storage = deeprec.StorageOption()
    assert (storage.storage_type, storage.storage_path) == (None, None)
    assert storage.storage_size == [1024**3] * 4  # padded to four tiers
    assert storage.cache_strategy == deeprec.CacheType.LFU
    ckpt = deeprec.CheckpointOption()
    assert (ckpt.ckpt_to_load_from, ckpt.tensor_name_in_ckpt, ckpt.always_load_from_specific_ckpt,
            ckpt.init_data_source) == (None, None, False, None)
    option = deeprec.EmbeddingVariableOption()
    assert (option.ht_type, option.ht_partition_num, option.evict_option, option.ckpt,
            option.filter_option) == ("", 1000, None, None, None)
    assert isinstance(option.storage_option, deeprec.StorageOption)
    assert isinstance(option.init_option, deeprec.InitializerOption)
    assert deeprec.InitializerOption(
        default_value_no_permission=0.5).default_value_no_permission == 0.5


@pytest.mark.parametrize("build,fragments", [
    (lambda d: d.CBFFilter(false_positive_probability=-0.5), ["false_positive_probability"]),
    (lambda d: d.CBFFilter(false_positive_probability=0.01), ["max_element_size"]),
    (lambda d: d.CBFFilter(max_element_size=100), ["max_element_size"]),
    (lambda d: d.StorageOption(storage_size=1024), ["storage_size"]),
    (lambda d: d.StorageOption(storage_path="/tmp/sok_ev_ssd"), ["storage_type"]),
    (lambda d: d.StorageOption(storage_type=d.StorageType.DRAM_SSDHASH), ["storage_path"]),
])
def test_option_classes_check_arguments_as_deeprec_does(deeprec, build, fragments):
    with pytest.raises(ValueError) as error:
        build(deeprec)
    assert ref.error_names(error.value, *fragments)


def test_initializer_option_takes_numpy_integers_as_get_embedding_variable_does(deeprec):
    assert deeprec.InitializerOption(default_value_dim=np.int64(4)).default_value_dim == 4
    # A bool is not taken for an integer.
    with pytest.raises(ValueError) as error:
        deeprec.InitializerOption(default_value_dim=True)
    assert ref.error_names(error.value, "default_value_dim", "True")


def test_an_option_of_the_wrong_class_is_refused(deeprec):
    with pytest.raises(TypeError) as error:
        deeprec.EmbeddingVariableOption(filter_option=deeprec.GlobalStepEvict(5))
    assert ref.error_names(error.value, "filter_option", "CounterFilter", "CBFFilter")


# --------------------------------------------------------------------------- unsupported features

UNSUPPORTED = {
    "ssd_storage": (lambda d: d.EmbeddingVariableOption(storage_option=d.StorageOption(
        d.StorageType.DRAM_SSDHASH, "/tmp/sok_ev_unused")), ["storage_type", "DRAM_SSDHASH"]),
    # HBM_DRAM itself is built (tests/test_tiered_storage.py); with an SSD
    # tier below it is not.
    "hbm_ssd_storage": (lambda d: d.EmbeddingVariableOption(storage_option=d.StorageOption(
        d.StorageType.HBM_DRAM_SSDHASH, "/tmp/sok_ev_unused")),
                        ["storage_type", "HBM_DRAM_SSDHASH"]),
    "checkpoint_option": (lambda d: d.EmbeddingVariableOption(ckpt=d.CheckpointOption(
        ckpt_to_load_from="/tmp/model.ckpt")), ["ckpt", "CheckpointOption"]),
    "ht_partition_num":
        (lambda d: d.EmbeddingVariableOption(ht_partition_num=8), ["ht_partition_num", "8"]),
}


@pytest.mark.parametrize("feature", sorted(UNSUPPORTED))
def test_unsupported_deeprec_option_raises_value_error_naming_it(deeprec, feature):
    build, fragments = UNSUPPORTED[feature]
    option = build(deeprec)  # creating the option works, so scripts get this far
    with ref.graph_session():
        with pytest.raises(ValueError) as error:
            deeprec.get_embedding_variable("emb", embedding_dim=DIM, ev_option=option)
        assert not tf.compat.v1.global_variables()  # nothing was created
        assert not tf.compat.v1.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES)
    assert ref.error_names(error.value, "emb", "not supported", *fragments)


@pytest.mark.parametrize("build", [
    lambda d: d.CounterFilter(3),
    lambda d: d.CBFFilter(3, 2**30, 0.01, tf.int64),
])
def test_deeprec_feature_filter_options_are_accepted(deeprec, unique_name, build):
    """DeepRec's documented filter options (tests/test_feature_filters.py
  pins down what they do)."""
    option = deeprec.EmbeddingVariableOption(filter_option=build(deeprec))
    with ref.graph_session():
        ev = deeprec.get_embedding_variable(unique_name(), embedding_dim=DIM, ev_option=option)
        assert ev.filter_attributes["filter_freq"] == 3


@pytest.mark.parametrize("threshold, expected", [(0.5, 0.5), (-1.0, None), (0.0, None)])
def test_deeprec_l2_weight_evict_option_is_accepted(deeprec, unique_name, threshold, expected):
    """DeepRec: a threshold <= 0 disables the eviction
  (tests/test_l2_weight_evict.py pins down what it does)."""
    option = deeprec.EmbeddingVariableOption(evict_option=deeprec.L2WeightEvict(threshold))
    with ref.graph_session():
        ev = deeprec.get_embedding_variable(unique_name(), embedding_dim=DIM, ev_option=option)
        assert ev.l2_weight_threshold == expected
        assert ev.steps_to_live is None


@pytest.mark.parametrize("storage_type", [None, "DRAM"])
def test_dram_storage_option_is_accepted(deeprec, unique_name, storage_type):
    storage = deeprec.StorageOption(
        storage_type=storage_type and getattr(deeprec.StorageType, storage_type))
    option = deeprec.EmbeddingVariableOption(
        storage_option=storage,
        init_option=deeprec.InitializerOption(default_value_no_permission=0.3))
    ev = deeprec.get_embedding_variable(unique_name(), embedding_dim=DIM, ev_option=option)
    assert ev.embedding_dim == DIM


# --------------------------------------------------------------------------- a DeepRec script


def test_deeprec_script_setup_runs_ev_init_ops_then_trains(deeprec):
    with ref.graph_session() as sess:
        ev = deeprec.get_embedding_variable("var_0",
                                            embedding_dim=3,
                                            initializer=deeprec.ones_initializer(tf.float32))
        emb = tf.nn.embedding_lookup(ev, tf.cast([0, 1, 2, 5, 6, 7], tf.int64))
        loss = tf.reduce_sum(tf.multiply(emb, 2.0))
        opt = deeprec.train.AdagradOptimizer(0.1)
        train_op = opt.apply_gradients(opt.compute_gradients(loss))
        assert ev.initializer in deeprec.get_collection(deeprec.GraphKeys.EV_INIT_VAR_OPS)
        assert deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES) == [ev]
        sess.run(deeprec.get_collection(deeprec.GraphKeys.EV_INIT_VAR_OPS))
        sess.run(deeprec.get_collection(deeprec.GraphKeys.EV_INIT_SLOT_OPS))
        sess.run([deeprec.global_variables_initializer()])
        first, _, _ = sess.run([emb, train_op, loss])
        second = sess.run(emb)
    np.testing.assert_array_equal(first, np.ones((6, 3), np.float32))
    # Adagrad from accumulator 0.1: each row moves by 0.1 * 2 / sqrt(0.1 + 4).
    np.testing.assert_allclose(second, 1.0 - 0.2 / np.sqrt(4.1), rtol=1e-6)


def test_install_deeprec_api_alone_lets_a_deeprec_script_train(deeprec):
    """The one call a DeepRec script needs on one worker: it also installs the
    optimizer hooks sok_ev.init() installs."""
    from sok_ev import keras_optimizers, optimizers  # pylint: disable=import-outside-toplevel
    optimizers.uninstall_optimizer_hook()
    keras_optimizers.uninstall_keras_optimizer_hook()
    try:
        import sok_ev  # pylint: disable=import-outside-toplevel
        sok_ev.install_deeprec_api()
        assert optimizers.optimizer_hook_installed()
        assert keras_optimizers.keras_optimizer_hook_installed()
        with ref.graph_session() as sess:
            ev = deeprec.get_embedding_variable("emb",
                                                embedding_dim=2,
                                                initializer=deeprec.zeros_initializer())
            loss = tf.reduce_sum(tf.nn.embedding_lookup(ev, tf.constant([3, 3, 5], tf.int64)))
            train = deeprec.train.GradientDescentOptimizer(0.5).minimize(loss)
            sess.run(deeprec.global_variables_initializer())
            sess.run(train)
            keys, rows = sess.run(ev.export())
        # SGD on sum(rows): key 3 (twice) moves by -1.0, key 5 by -0.5.
        assert ref.export_to_dict(keys, rows).keys() == {3, 5}
        np.testing.assert_array_equal(ref.export_to_dict(keys, rows)[3], [-1.0, -1.0])
        np.testing.assert_array_equal(ref.export_to_dict(keys, rows)[5], [-0.5, -0.5])
    finally:
        optimizers.install_optimizer_hook()
        keras_optimizers.install_keras_optimizer_hook()


def test_install_deeprec_api_alone_lets_a_deeprec_script_save_and_restore(deeprec, tmp_path):
    """The one call a DeepRec script needs on one worker: it also installs the
    tf.compat.v1.train.Saver hook sok_ev.init() installs."""
    from sok_ev import checkpoint  # pylint: disable=import-outside-toplevel
    import sok_ev  # pylint: disable=import-outside-toplevel
    prefix = str(tmp_path / "model")

    def model():
        ev = deeprec.get_embedding_variable("emb",
                                            embedding_dim=2,
                                            initializer=deeprec.zeros_initializer())
        loss = tf.reduce_sum(tf.nn.embedding_lookup(ev, tf.constant([3, 3, 5], tf.int64)))
        return ev, deeprec.train.AdagradOptimizer(0.1).minimize(loss)

    checkpoint.uninstall_saver_hook()
    try:
        sok_ev.install_deeprec_api()
        assert checkpoint.saver_hook_installed()
        with ref.graph_session() as sess:
            ev, train = model()
            saver = deeprec.train.Saver()
            sess.run(deeprec.global_variables_initializer())
            sess.run(train)
            saved = ref.export_to_dict(*sess.run(ev.export()))
            saver.save(sess, prefix)
        with ref.graph_session() as sess:
            ev, _ = model()
            deeprec.train.Saver().restore(sess, prefix)
            restored = ref.export_to_dict(*sess.run(ev.export()))
    finally:
        checkpoint.install_saver_hook()
    # Adagrad from accumulator 0.1: key 3 (gradient 2) moves by -0.1 * 2 / sqrt(4.1).
    np.testing.assert_allclose(saved[3], [-0.2 / np.sqrt(4.1)] * 2, rtol=1e-6)
    assert restored.keys() == saved.keys() == {3, 5}
    for key, row in saved.items():
        np.testing.assert_array_equal(restored[key], row)


# --------------------------------------------------------------------------- initializer classes

INITIALIZER_CLASSES = {
    "v1_ones": (lambda: tf.compat.v1.ones_initializer, 1.0),
    "v1_zeros": (lambda: tf.compat.v1.zeros_initializer, 0.0),
    "keras_ones": (lambda: tf.keras.initializers.Ones, 1.0),
    "v2_zeros": (lambda: tf.zeros_initializer, 0.0),
}


@pytest.mark.parametrize("kind", sorted(INITIALIZER_CLASSES))
@pytest.mark.parametrize("where", ["argument", "init_option"])
def test_initializer_given_as_a_class_is_instantiated_as_deeprec_does(deeprec, rng, unique_name,
                                                                      kind, where):
    cls, value = INITIALIZER_CLASSES[kind]
    keys = rng.integers(-1000, 1000, size=8)
    if where == "argument":
        ev = deeprec.get_embedding_variable(unique_name(), embedding_dim=DIM, initializer=cls())
    else:
        option = deeprec.EmbeddingVariableOption(
            init_option=deeprec.InitializerOption(initializer=cls(), default_value_dim=16))
        ev = deeprec.get_embedding_variable(unique_name(), embedding_dim=DIM, ev_option=option)
    rows = tf.nn.embedding_lookup(ev, tf.constant(keys, tf.int64)).numpy()
    np.testing.assert_array_equal(rows, np.full((8, DIM), value, np.float32))


def test_glorot_uniform_initializer_class_draws_the_default_value_matrix(deeprec, unique_name):
    # DeepRec's documented use: InitializerOption(initializer=tf.glorot_uniform_initializer).
    n = 64
    option = deeprec.EmbeddingVariableOption(init_option=deeprec.InitializerOption(
        initializer=deeprec.glorot_uniform_initializer, default_value_dim=n))
    ev = deeprec.get_embedding_variable(unique_name(), embedding_dim=DIM, ev_option=option)
    rows = tf.nn.embedding_lookup(ev, tf.range(n, dtype=tf.int64)).numpy()
    limit = np.sqrt(6.0 / (n + DIM))  # glorot uniform over the [n, dim] matrix
    assert np.all(np.abs(rows) <= limit)
    assert len(np.unique(rows)) > n  # drawn, not constant
    # Key k takes row k mod n.
    again = tf.nn.embedding_lookup(ev, tf.range(n, 2 * n, dtype=tf.int64)).numpy()
    np.testing.assert_array_equal(again, rows)


def test_an_initializer_that_is_not_callable_is_refused_naming_initializer(deeprec, unique_name):
    with pytest.raises(TypeError) as error:
        deeprec.get_embedding_variable(unique_name(), embedding_dim=DIM, initializer=0.5)
    assert ref.error_names(error.value, "initializer", "0.5")
    assert "default_value_dim" not in str(error.value)
