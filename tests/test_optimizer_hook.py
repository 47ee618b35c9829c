"""The optimizer hook is narrow: installed only by sok_ev.init(), never by
import; it changes nothing for variables that are not Embedding Variables;
and the private TensorFlow names it replaces exist, with the parameters it
expects, in the installed TensorFlow.
"""
import inspect
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training import optimizer as optimizer_module

from sok_ev_reference import graph_session, sok_ev_import_root

# What sok_ev/optimizers.py replaces, and the parameters it relies on.
HOOKED = {
    "_get_processor": ["v"],
    "Optimizer.apply_gradients": [
        "self", "grads_and_vars", "global_step", "name", "skip_gradients_aggregation"
    ],
    "Optimizer._zeros_slot": ["self", "var", "slot_name", "op_name"],
    "Optimizer._get_or_make_slot": ["self", "var", "val", "slot_name", "op_name"],
    "Optimizer._get_or_make_slot_with_initializer": [
        "self", "var", "initializer", "shape", "dtype", "slot_name", "op_name"
    ],
}


def _resolve(dotted):
    target = optimizer_module
    for part in dotted.split("."):
        target = getattr(target, part)
    return target


def test_hooked_tensorflow_functions_exist_with_the_expected_parameters(sok):
    sok.optimizers.uninstall_optimizer_hook()
    try:
        for name, parameters in HOOKED.items():
            assert list(inspect.signature(_resolve(name)).parameters) == parameters, (
                f"TensorFlow {tf.__version__} changed {name}; sok_ev/optimizers.py "
                "must be updated")
    finally:
        sok.init()


def test_importing_sok_ev_installs_no_hook():
    script = textwrap.dedent("""
        from tensorflow.python.training import optimizer
        before = (optimizer._get_processor, optimizer.Optimizer._zeros_slot)
        import sok_ev
        after = (optimizer._get_processor, optimizer.Optimizer._zeros_slot)
        assert before == after, "import patched TensorFlow"
        sok_ev.init()
        assert optimizer._get_processor is not before[0], "init did not install"
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script],
                            capture_output=True,
                            text=True,
                            cwd=sok_ev_import_root(),
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr


def test_init_twice_wraps_once_and_uninstall_restores_tensorflow(sok):
    sok.init()
    hooked = optimizer_module._get_processor
    sok.init()
    assert optimizer_module._get_processor is hooked
    sok.optimizers.uninstall_optimizer_hook()
    try:
        assert optimizer_module._get_processor.__module__ == optimizer_module.__name__
        for name in HOOKED:
            assert _resolve(name).__module__ == optimizer_module.__name__, name
    finally:
        sok.init()


def _train_dense_model(make_optimizer, initial_values, batches):
    """Trains two dense variables (one with sparse gradients) in a Session."""
    with graph_session() as sess:
        table = tf.compat.v1.get_variable("table", initializer=initial_values[0], use_resource=True)
        weights = tf.compat.v1.get_variable("weights",
                                            initializer=initial_values[1],
                                            use_resource=True)
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = tf.nn.embedding_lookup(table, ids)
        loss = tf.reduce_sum(tf.square(tf.matmul(rows, weights)))
        train = make_optimizer().minimize(loss)
        sess.run(tf.compat.v1.global_variables_initializer())
        for batch in batches:
            sess.run(train, {ids: batch})
        return sess.run([table, weights])


@pytest.mark.parametrize("make_optimizer", [
    lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    lambda: tf.compat.v1.train.AdamOptimizer(0.01),
    lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01),
    lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5),
],
                         ids=["adagrad", "adam", "ftrl", "rmsprop"])
def test_hook_leaves_dense_variables_bit_identical(sok, rng, make_optimizer):
    initial = [
        rng.normal(size=(20, 4)).astype(np.float32),
        rng.normal(size=(4, 2)).astype(np.float32)
    ]
    batches = [rng.integers(0, 20, size=8) for _ in range(4)]
    with_hook = _train_dense_model(make_optimizer, initial, batches)
    sok.optimizers.uninstall_optimizer_hook()
    try:
        without_hook = _train_dense_model(make_optimizer, initial, batches)
    finally:
        sok.init()
    for hooked, stock in zip(with_hook, without_hook):
        np.testing.assert_array_equal(hooked, stock)
