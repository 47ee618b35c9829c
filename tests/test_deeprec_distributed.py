"""DeepRec's tf.config.experimental.enable_distributed_strategy (sok_ev.deeprec_distributed).

"collective" initialises Horovod and sok-ev's workers; launched alone, the
process is one worker and the group embedding columns give what a stock
mean-combined lookup of the same rows gives (NumPy reference). Run in a
child process: it initialises Horovod.
"""
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

import sok_ev_reference as ref

import sok_ev
from sok_ev import deeprec_distributed

sok_ev.install_deeprec_api()

_CHILD = textwrap.dedent("""
    import json
    import numpy as np
    import tensorflow.compat.v1 as tf
    tf.disable_v2_behavior()
    import sok_ev
    sok_ev.install_deeprec_api()
    tf.config.experimental.enable_distributed_strategy(strategy="collective")
    from sok_ev import deeprec_distributed
    ids = {"a": [[3, 5], [7, -1], [3, 3]], "b": [[1, -1], [2, 9], [-1, -1]]}
    features = {k: tf.constant(v, tf.int64) for k, v in ids.items()}
    columns = []
    with tf.feature_column.group_embedding_column_scope(name="g"):
        for key in ("a", "b"):
            c = tf.feature_column.categorical_column_with_embedding(key, dtype=tf.int64)
            columns.append(tf.feature_column.embedding_column(c, dimension=4, combiner="mean"))
    outputs = {}
    out = tf.feature_column.input_layer(features, columns, cols_to_output_tensors=outputs)
    variables = [tf.get_collection(tf.GraphKeys.EMBEDDING_VARIABLES)[i] for i in range(2)]
    with tf.Session() as session:
        session.run(tf.global_variables_initializer())
        got = session.run(out)
        expected = []
        for key, variable in zip(("a", "b"), sorted(variables, key=lambda v: v.name)):
            rows = []
            for row in ids[key]:
                keys = [k for k in row if k >= 0]
                if not keys:
                    rows.append(np.zeros(4, np.float32))
                    continue
                values = session.run(variable.sparse_read(tf.constant(keys, tf.int64)))
                rows.append(values.mean(axis=0))
            expected.append(np.stack(rows))
    np.testing.assert_allclose(got, np.concatenate(expected, axis=1), rtol=1e-6)
    print(json.dumps({"strategy": deeprec_distributed.strategy(),
                      "world_size": sok_ev.world_size()}))
""")


def test_collective_strategy_alone_is_one_worker_and_looks_up_as_stock():
    env = ref.child_env()
    for variable in ("HOROVOD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "WORLD_SIZE"):
        env.pop(variable, None)
    result = subprocess.run([sys.executable, "-c", _CHILD],
                            env=env,
                            capture_output=True,
                            text=True,
                            timeout=300,
                            check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == ('{"strategy": "collective", '
                                                      '"world_size": 1}')


def test_enable_distributed_strategy_is_installed_on_tf_config():
    assert (tf.config.experimental.enable_distributed_strategy
            is deeprec_distributed.enable_distributed_strategy)
    assert (tf.compat.v1.config.experimental.enable_distributed_strategy
            is deeprec_distributed.enable_distributed_strategy)


def test_enable_distributed_strategy_refuses_other_strategies():
    with pytest.raises(ValueError, match="parameter_server"):
        deeprec_distributed.enable_distributed_strategy(strategy="parameter_server")
