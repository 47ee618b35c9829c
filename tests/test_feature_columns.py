"""DeepRec's feature columns over Embedding Variables (sok_ev/feature_column.py),
after sok_ev.install_deeprec_api(), in a tf.compat.v1 graph.

Pinned down:
* string ids map to DeepRec's keys: tf.strings.to_hash_bucket_fast(id,
  2**63 - 1), i.e. FarmHash Fingerprint64 modulo 2**63 - 1 (checked on the
  empty string against Fingerprint64's published value, 0x9ae16a3b2f90404f);
  integer ids are their own keys, int32 ids in an int32-keyed table;
* input_layer over categorical_column_with_embedding + embedding_column
  equals the same model built from stock columns (categorical_column_with_
  identity over each key's position among the batch's keys, embedding_column
  on a dense variable holding the Embedding Variable's initial rows) for
  every combiner and id dtype, with max_norm, and after a training step
  with the same optimizer (under MonitoredTrainingSession) the rows agree;
  random batches with duplicates and empty rows (the last one too);
* the Embedding Variable is named as DeepRec names it,
  input_layer/<key>_embedding/embedding_weights, and cols_to_output_tensors
  and cols_to_vars are filled; the references run TensorFlow's own
  input_layer;
* shared_embedding_columns share one Embedding Variable; a second use of the
  same shared name with another dimension raises naming the column and both
  dimensions before anything is created;
* group_embedding_column_scope: every Embedding Variable column of a group
  is looked up in one sok_ev.lookup_sparse call, with the ungrouped result;
  grouped shared columns train their one variable;
* weighted_categorical_column over an Embedding Variable column weighs the
  combination as the stock lookup with weights, and a grouped one drops
  negative ids and weights <= 0 as the safe lookup does; an indicator_column over one
  is refused (TensorFlow would read it as a one-bucket column);
* tf.nn.group_embedding_lookup_sparse equals tf.nn.embedding_lookup_sparse
  on dense tables holding the same rows;
* partition_num N > 1 makes DeepRec's partitioned Embedding Variable
  (embedding_weights/part_<i>, key k in part (k mod 1000) mod N), which
  trains as one table, grouped or not, and shared columns share one;
* refusals name the feature or the column and the value: DeepRec columns not
  built, unsupported dtypes, a partition_num outside 1..1024 (or above 1 on
  an adaptive column), ckpt_to_load_from, ids of the
  wrong kind, mixed shared columns, max_norm in a group, is_sequence; the
  optimisation flag do_fusion is accepted.
"""
import collections
import contextlib

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

N_ROWS, DIM = 16, 4
TF1 = tf.compat.v1
ID_DTYPES = ("string", "int32", "int64")
# Fingerprint64("") in FarmHash is its constant k2 (farmhash.h).
FINGERPRINT64_OF_EMPTY_STRING = 0x9ae16a3b2f90404f

# TensorFlow's own input_layer, for the references.
STOCK_INPUT_LAYER = TF1.feature_column.input_layer


@pytest.fixture(scope="module")
def deeprec(sok):
    sok.install_deeprec_api()
    return TF1


def _ids_of(keys, id_dtype):
    """The feature values a user feeds for integer draws `keys`."""
    if id_dtype == "string":
        return np.array([f"id{k}".encode() for k in keys], dtype=object)
    return keys.astype(id_dtype)


def _batch(rng, id_dtype, draw=N_ROWS * 3):
    batch = ref.random_sparse_batch(rng, 6, 3, lambda n: rng.integers(0, draw, size=n), np.int64)
    return batch, _ids_of(batch.keys, id_dtype)


def _ev_column(deeprec, key, id_dtype, matrix, partition_num=None, **kwargs):
    column = deeprec.feature_column.categorical_column_with_embedding(
        key,
        dtype=tf.as_dtype(id_dtype),
        partition_num=partition_num,
        ev_option=deeprec.EmbeddingVariableOption(init_option=deeprec.InitializerOption(
            default_value_dim=matrix.shape[0])))
    return deeprec.feature_column.embedding_column(column,
                                                   dimension=matrix.shape[1],
                                                   initializer=tf.constant_initializer(matrix),
                                                   **kwargs)


def _sparse(batch, values):
    return tf.SparseTensor(batch.indices, values, batch.dense_shape)


# --------------------------------------------------------------------------- keys


def test_string_ids_map_to_fingerprint64_modulo_the_largest_int64(deeprec):
    column = deeprec.feature_column.categorical_column_with_embedding("s", dtype=tf.string)
    ids = np.array([b"", b"a", b"hello", "日本".encode(), b"id17"], dtype=object)
    keys = column.keys(tf.SparseTensor([[0, i] for i in range(len(ids))], ids, [1, len(ids)]))
    got = keys.values.numpy()
    assert keys.values.dtype == tf.int64
    assert got[0] == FINGERPRINT64_OF_EMPTY_STRING % (2**63 - 1)
    np.testing.assert_array_equal(got, tf.strings.to_hash_bucket_fast(ids, 2**63 - 1).numpy())
    assert np.all(got >= 0)


@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_integer_ids_are_their_own_keys(deeprec, rng, id_dtype):
    batch, ids = _batch(rng, id_dtype, draw=10**6)
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    with ref.graph_session() as sess:
        column = _ev_column(deeprec, "ids", id_dtype, matrix)
        out = deeprec.feature_column.input_layer({"ids": _sparse(batch, ids)}, [column])
        ev, = deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES)
        assert ev.key_dtype == tf.as_dtype(id_dtype)
        sess.run(deeprec.global_variables_initializer())
        sess.run(out)
        keys, _ = sess.run(ev.export())
    assert set(keys.tolist()) == set(ids.astype(np.int64).tolist())


# --------------------------------------------------------------------------- against stock columns


def _stock_model(deeprec, batches, keys, matrices, combiner, max_norm):
    """The reference: stock identity columns over each key's position among
    its column's keys (`keys[name]`, from ref.deeprec_keys), stock embedding
    columns on dense variables holding the keys' initial rows (DeepRec: key
    k starts at matrix[k mod N])."""
    features, columns, uniques = {}, [], []
    for name, (batch, _) in batches.items():
        uniq, positions = ref.remap_to_unique(keys[name])
        uniques.append(uniq)
        features[name] = _sparse(batch, positions)
        identity = deeprec.feature_column.categorical_column_with_identity(name, len(uniq))
        columns.append(
            deeprec.feature_column.embedding_column(identity,
                                                    DIM,
                                                    combiner=combiner,
                                                    max_norm=max_norm,
                                                    initializer=tf.constant_initializer(
                                                        ref.initial_rows(matrices[name], uniq))))
    return features, columns, uniques


def _train_one_step(deeprec, features, columns, upstream, use_monitored_session, input_layer):
    """input_layer output before, then one Adagrad step on sum(out * upstream);
    returns (output, {variable name: value or (keys, rows)})."""
    out = input_layer(features, columns)
    loss = tf.reduce_sum(out * upstream)
    train = deeprec.train.AdagradOptimizer(0.3).minimize(
        loss, global_step=deeprec.train.get_or_create_global_step())
    # Every fetch is built first: MonitoredTrainingSession finalizes the graph.
    tables = {
        ev.name: ev.export() for ev in deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES)
    }
    tables.update({
        v.name: v.read_value()
        for v in deeprec.global_variables()
        if "embedding_weights" in v.name and v.name not in tables
    })
    if use_monitored_session:
        session = deeprec.train.MonitoredTrainingSession()
    else:
        session = deeprec.Session()
        session.run(deeprec.global_variables_initializer())
    with session:
        before = session.run(out)
        session.run(train)
        after = session.run(tables)
    return before, after


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
def test_input_layer_equals_stock_columns_before_and_after_a_training_step(
        deeprec, rng, id_dtype, combiner):
    batches = {name: _batch(rng, id_dtype) for name in ("a", "b")}
    matrices = {name: ref.random_matrix(rng, N_ROWS, DIM) for name in batches}
    upstream = rng.normal(size=(6, 2 * DIM)).astype(np.float32)
    keys = {name: ref.deeprec_keys(ids) for name, (_, ids) in batches.items()}
    with tf.Graph().as_default():
        columns = [
            _ev_column(deeprec, name, id_dtype, matrices[name], combiner=combiner)
            for name in batches
        ]
        features = {name: _sparse(b, ids) for name, (b, ids) in batches.items()}
        got, got_tables = _train_one_step(deeprec, features, columns, upstream, True,
                                          deeprec.feature_column.input_layer)
    with tf.Graph().as_default():
        features, columns, uniques = _stock_model(deeprec, batches, keys, matrices, combiner, None)
        expected, expected_tables = _train_one_step(deeprec, features, columns, upstream, False,
                                                    STOCK_INPUT_LAYER)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    for name, uniq in zip(batches, uniques):
        keys, rows = got_tables[f"input_layer/{name}_embedding/embedding_weights:0"]
        dense = expected_tables[f"input_layer/{name}_embedding/embedding_weights:0"]
        ref.assert_rows_close(ref.export_to_dict(keys, rows), {
            int(k): dense[i] for i, k in enumerate(uniq)
        },
                              rtol=1e-5,
                              atol=1e-6,
                              what=f"column {name} after one step")


def test_max_norm_clips_rows_as_stock_columns_do(deeprec, rng):
    batches = {"a": _batch(rng, "int64")}
    matrices = {"a": 3.0 * ref.random_matrix(rng, N_ROWS, DIM)}
    with ref.graph_session() as sess:
        column = _ev_column(deeprec, "a", "int64", matrices["a"], max_norm=1.5)
        out = deeprec.feature_column.input_layer({"a": _sparse(*batches["a"])}, [column])
        sess.run(deeprec.global_variables_initializer())
        got = sess.run(out)
    with ref.graph_session() as sess:
        features, columns, _ = _stock_model(deeprec, batches, {"a": batches["a"][0].keys}, matrices,
                                            "mean", 1.5)
        out = STOCK_INPUT_LAYER(features, columns)
        sess.run(deeprec.global_variables_initializer())
        expected = sess.run(out)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_weighted_ev_column_equals_stock_weighted_column(deeprec, rng, combiner):
    batch, ids = _batch(rng, "int64")
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    with ref.graph_session() as sess:
        weights = _sparse(batch, batch.weights)
        column = deeprec.feature_column.categorical_column_with_embedding(
            "a",
            dtype=tf.int64,
            ev_option=deeprec.EmbeddingVariableOption(init_option=deeprec.InitializerOption(
                default_value_dim=N_ROWS)))
        weighted = deeprec.feature_column.weighted_categorical_column(column, "w")
        embedded = deeprec.feature_column.embedding_column(
            weighted, DIM, combiner=combiner, initializer=tf.constant_initializer(matrix))
        out = deeprec.feature_column.input_layer({
            "a": _sparse(batch, ids),
            "w": weights
        }, [embedded])
        sess.run(deeprec.global_variables_initializer())
        got = sess.run(out)
    np.testing.assert_allclose(got,
                               ref.reference_lookup(matrix, batch, combiner, True),
                               rtol=1e-5,
                               atol=1e-6)


def test_grouped_weighted_column_drops_what_the_safe_lookup_drops(deeprec, rng):
    """Negative ids and weights <= 0 are left out, grouped or not."""
    batch, ids = _batch(rng, "int64")
    ids[::3] = -ids[::3] - 1
    weights = batch.weights.copy()
    weights[1::4] = 0.0
    weights[2::5] = -1.0
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    results = []
    for grouped in (True, False):
        with ref.graph_session() as sess:
            column = deeprec.feature_column.weighted_categorical_column(
                deeprec.feature_column.categorical_column_with_embedding(
                    "a",
                    dtype=tf.int64,
                    ev_option=deeprec.EmbeddingVariableOption(init_option=deeprec.InitializerOption(
                        default_value_dim=N_ROWS))), "w")
            scope = (deeprec.feature_column.group_embedding_column_scope("g")
                     if grouped else contextlib.nullcontext())
            with scope:
                embedded = deeprec.feature_column.embedding_column(
                    column, DIM, combiner="mean", initializer=tf.constant_initializer(matrix))
            out = deeprec.feature_column.input_layer(
                {
                    "a": _sparse(batch, ids),
                    "w": _sparse(batch, weights)
                }, [embedded])
            sess.run(deeprec.global_variables_initializer())
            results.append(sess.run(out))
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)


def test_indicator_column_over_an_ev_column_is_refused_naming_it(deeprec, rng):
    batch, ids = _batch(rng, "int64")
    with ref.graph_session():
        column = deeprec.feature_column.categorical_column_with_embedding("C9", dtype=tf.int64)
        indicator = deeprec.feature_column.indicator_column(column)
        with pytest.raises(ValueError) as error:
            deeprec.feature_column.input_layer({"C9": _sparse(batch, ids)}, [indicator])
        assert ref.error_names(error.value, "IndicatorColumn", "C9")


def test_embedding_variable_is_named_as_deeprec_and_outputs_are_reported(deeprec, rng):
    batch, ids = _batch(rng, "string")
    with ref.graph_session():
        column = _ev_column(deeprec, "C1", "string", ref.random_matrix(rng, N_ROWS, DIM))
        numeric = deeprec.feature_column.numeric_column("n")
        outputs, variables = {}, {}
        net = deeprec.feature_column.input_layer({
            "C1": _sparse(batch, ids),
            "n": tf.ones([6, 1])
        }, [numeric, column],
                                                 cols_to_output_tensors=outputs,
                                                 cols_to_vars=variables)
        ev, = deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES)
        assert ev.name == "input_layer/C1_embedding/embedding_weights:0"
        assert variables[column] == [ev]
        assert outputs[column].shape.as_list() == [6, DIM]
        assert outputs[numeric].shape.as_list() == [6, 1]
        # Columns in name order, as TensorFlow's input_layer: C1_embedding, n.
        assert net.shape.as_list() == [6, DIM + 1]


# --------------------------------------------------------------------------- partitioned columns


def test_partition_num_makes_deeprecs_partitioned_variable_with_its_names_and_routing(deeprec, rng):
    """As DeepRec: partition_num=4 gives embedding_weights/part_0..3, key k
  stored in part (k mod 1000) mod 4; cols_to_vars lists the parts."""
    batch, ids = _batch(rng, "int64", draw=10**6)
    with ref.graph_session() as sess:
        column = _ev_column(deeprec, "C1", "int64", ref.random_matrix(rng, N_ROWS, DIM), 4)
        variables = {}
        out = deeprec.feature_column.input_layer({"C1": _sparse(batch, ids)}, [column],
                                                 cols_to_vars=variables)
        parts = deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES)
        assert [p.name for p in parts
               ] == [f"input_layer/C1_embedding/embedding_weights/part_{i}:0" for i in range(4)]
        assert variables[column] == parts
        sess.run(deeprec.global_variables_initializer())
        sess.run(out)
        stored = [sess.run(p.export())[0] for p in parts]
    for i, keys in enumerate(stored):
        assert np.all((keys % 1000) % 4 == i), (i, keys)
    assert sorted(np.concatenate(stored).tolist()) == sorted(set(ids.tolist()))


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("id_dtype", ["string", "int32"])
def test_a_partitioned_column_trains_as_the_same_column_in_one_table(deeprec, rng, grouped,
                                                                     id_dtype):
    """Three Adagrad steps through input_layer: partition_num=3 and one table
  give the same outputs and rows, in a group_embedding_column_scope too
  (a partitioned column is looked up on its own there)."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    batches = [_batch(rng, id_dtype, draw=5000) for _ in range(3)]
    results = []
    for partition_num in (3, None):
        with ref.graph_session() as sess:
            scope = (deeprec.feature_column.group_embedding_column_scope("g")
                     if grouped else contextlib.nullcontext())
            with scope:
                column = _ev_column(deeprec,
                                    "C1",
                                    id_dtype,
                                    matrix,
                                    partition_num,
                                    combiner="sqrtn")
            values = TF1.placeholder(tf.as_dtype(id_dtype), [None])
            indices = TF1.placeholder(tf.int64, [None, 2])
            shape = TF1.placeholder(tf.int64, [2])
            net = deeprec.feature_column.input_layer(
                {"C1": tf.SparseTensor(indices, values, shape)}, [column])
            train = deeprec.train.AdagradOptimizer(0.3).minimize(tf.reduce_sum(net * net))
            sess.run(deeprec.global_variables_initializer())
            outputs = []
            for batch, ids in batches:
                feed = {values: ids, indices: batch.indices, shape: batch.dense_shape}
                outputs.append(sess.run([net, train], feed)[0])
            parts = deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES)
            assert len(parts) == (partition_num or 1)
            exported = [sess.run(p.export()) for p in parts]
        keys = np.concatenate([k for k, _ in exported])
        rows = np.concatenate([r for _, r in exported])
        results.append((outputs, ref.export_to_dict(keys, rows)))
    (partitioned, partitioned_rows), (whole, whole_rows) = results
    for step, (a, b) in enumerate(zip(partitioned, whole)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7, err_msg=f"step {step}")
    ref.assert_rows_close(partitioned_rows, whole_rows, rtol=1e-6, atol=1e-7)
    assert partitioned_rows.keys() == whole_rows.keys()


def test_shared_columns_of_different_partition_num_are_refused_naming_them(deeprec):
    make = lambda key, parts: deeprec.feature_column.categorical_column_with_embedding(
        key, dtype=tf.int64, partition_num=parts)
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.shared_embedding_columns([make("a", 2), make("b", 3)], DIM)
    assert ref.error_names(error.value, "partition_num", "[2, 3]")


# --------------------------------------------------------------------------- shared columns


@pytest.mark.parametrize("partition_num, names", [
    (None, ["input_layer/a_b_shared_embedding/embedding_weights:0"]),
    (2, [f"input_layer/a_b_shared_embedding/embedding_weights/part_{i}:0" for i in range(2)]),
])
def test_shared_embedding_columns_share_one_embedding_variable(deeprec, rng, partition_num, names):
    """One Embedding Variable for both columns (partitioned: its parts)."""
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    (batch_a, ids_a), (batch_b, ids_b) = _batch(rng, "int64"), _batch(rng, "int64")
    option = deeprec.EmbeddingVariableOption(init_option=deeprec.InitializerOption(
        default_value_dim=N_ROWS))
    with ref.graph_session() as sess:
        a, b = (deeprec.feature_column.categorical_column_with_embedding(
            k, dtype=tf.int64, partition_num=partition_num, ev_option=option) for k in ("a", "b"))
        shared = deeprec.feature_column.shared_embedding_columns(
            [a, b], DIM, combiner="sum", initializer=tf.constant_initializer(matrix))
        outputs = {}
        deeprec.feature_column.input_layer(
            {
                "a": _sparse(batch_a, ids_a),
                "b": _sparse(batch_b, ids_b)
            },
            shared,
            cols_to_output_tensors=outputs)
        variables = deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES)
        assert [v.name for v in variables] == names
        sess.run(deeprec.global_variables_initializer())
        got_a, got_b = sess.run([outputs[shared[0]], outputs[shared[1]]])
    np.testing.assert_allclose(got_a, ref.reference_lookup(matrix, batch_a, "sum", False), 1e-6)
    np.testing.assert_allclose(got_b, ref.reference_lookup(matrix, batch_b, "sum", False), 1e-6)


def test_shared_name_reused_with_another_dimension_raises_before_creating_anything(deeprec, rng):
    batch, ids = _batch(rng, "int64")
    with ref.graph_session():
        a = deeprec.feature_column.categorical_column_with_embedding("a", dtype=tf.int64)
        b = deeprec.feature_column.categorical_column_with_embedding("b", dtype=tf.int64)
        first = deeprec.feature_column.shared_embedding_columns(
            [a], DIM, shared_embedding_collection_name="shared")
        second = deeprec.feature_column.shared_embedding_columns(
            [b], DIM + 3, shared_embedding_collection_name="shared")
        features = {"a": _sparse(batch, ids), "b": _sparse(batch, ids)}
        deeprec.feature_column.input_layer(features, first)
        before = list(deeprec.global_variables())
        with pytest.raises(ValueError) as error:
            deeprec.feature_column.input_layer(features, second)
        assert ref.error_names(error.value, "b_shared_embedding", str(DIM + 3), str(DIM), "shared")
        assert list(deeprec.global_variables()) == before


# --------------------------------------------------------------------------- grouped lookups


def test_group_scope_looks_every_column_up_in_one_lookup_sparse_call(deeprec, rng, monkeypatch):
    from sok_ev import feature_column  # pylint: disable=import-outside-toplevel
    calls = []
    original = feature_column.lookup_sparse

    def counting(params, *args, **kwargs):
        calls.append([p.name for p in params])
        return original(params, *args, **kwargs)

    monkeypatch.setattr(feature_column, "lookup_sparse", counting)
    batches = {name: _batch(rng, dtype) for name, dtype in (("a", "string"), ("b", "int32"))}
    batches["c"] = _batch(rng, "int64")
    matrices = {name: ref.random_matrix(rng, N_ROWS, DIM) for name in batches}
    dtypes = {"a": "string", "b": "int32", "c": "int64"}
    features = lambda: {name: _sparse(b, ids) for name, (b, ids) in batches.items()}
    results = []
    for grouped in (True, False):
        with ref.graph_session() as sess:
            if grouped:
                with deeprec.feature_column.group_embedding_column_scope(name="categorical"):
                    columns = [
                        _ev_column(deeprec, n, dtypes[n], matrices[n], combiner="sum")
                        for n in batches
                    ]
            else:
                columns = [
                    _ev_column(deeprec, n, dtypes[n], matrices[n], combiner="sum") for n in batches
                ]
            out = deeprec.feature_column.input_layer(features(), columns)
            sess.run(deeprec.global_variables_initializer())
            results.append(sess.run(out))
    assert calls == [[f"input_layer/{n}_embedding/embedding_weights:0" for n in "abc"]]
    np.testing.assert_allclose(results[0], results[1], rtol=1e-6, atol=1e-6)


def test_grouped_shared_columns_train_their_one_variable_in_one_call(deeprec, rng):
    (batch_a, ids_a), (batch_b, ids_b) = _batch(rng, "int64"), _batch(rng, "int64")
    with ref.graph_session():
        a, b = (deeprec.feature_column.categorical_column_with_embedding(k, dtype=tf.int64)
                for k in ("a", "b"))
        with deeprec.feature_column.group_embedding_column_scope("g"):
            shared = deeprec.feature_column.shared_embedding_columns(
                [a, b], DIM, combiner="sum", initializer=tf.constant_initializer(1.0))
        net = deeprec.feature_column.input_layer(
            {
                "a": _sparse(batch_a, ids_a),
                "b": _sparse(batch_b, ids_b)
            }, shared)
        train = deeprec.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(net))
        ev, = deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES)
        export = ev.export()
        with deeprec.train.MonitoredTrainingSession() as sess:
            sess.run(train)
            keys, rows = sess.run(export)
    # SGD on the sum of all outputs: each row moves by 0.1 per occurrence of
    # its key in either column.
    occurrences = collections.Counter(ids_a.tolist() + ids_b.tolist())
    ref.assert_rows_close(ref.export_to_dict(keys, rows), {
        k: np.full(DIM, 1.0 - 0.1 * n, np.float32) for k, n in occurrences.items()
    },
                          rtol=1e-6,
                          atol=1e-6)


def test_group_embedding_lookup_sparse_equals_dense_lookups(deeprec, rng, sok, unique_name):
    matrices = [ref.random_matrix(rng, N_ROWS, d) for d in (DIM, DIM + 2)]
    evs = [ref.matrix_ev(sok, unique_name(), m) for m in matrices]
    batches = [_batch(rng, "int64")[0] for _ in evs]
    combiners = ["sum", "mean"]
    # Entries out of order: the lookup reorders them.
    shuffled = [
        tf.sparse.SparseTensor(b.indices[::-1], b.keys[::-1], b.dense_shape) for b in batches
    ]
    weights = [
        None, tf.SparseTensor(batches[1].indices, batches[1].weights, batches[1].dense_shape)
    ]
    got = tf.nn.group_embedding_lookup_sparse(evs,
                                              shuffled,
                                              combiners,
                                              sp_weights=weights,
                                              partition_strategy="div")
    for t, (m, b, c) in enumerate(zip(matrices, batches, combiners)):
        np.testing.assert_allclose(got[t].numpy(),
                                   ref.reference_lookup(m, b, c, t == 1),
                                   rtol=1e-5,
                                   atol=1e-6)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("name",
                         ["categorical_column_with_multi_hash_bucket", "coalesced_embedding_scope"])
def test_deeprec_columns_not_built_are_refused_naming_them(deeprec, name):
    for module in (tf.feature_column, TF1.feature_column):
        with pytest.raises(ValueError) as error:
            getattr(module, name)("C1", 100)
        assert ref.error_names(error.value, name, "not build")


@pytest.mark.parametrize("dtype", [tf.float32, tf.bool, tf.int16])
def test_a_dtype_the_column_cannot_take_is_refused_naming_column_and_dtype(deeprec, dtype):
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.categorical_column_with_embedding("C7", dtype=dtype)
    assert ref.error_names(error.value, "C7", dtype.name)


@pytest.mark.parametrize("partition_num", [0, -2, 2.5, True, "4", 1025])
def test_a_partition_num_that_is_not_1_to_1024_is_refused_naming_it(deeprec, partition_num):
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.categorical_column_with_embedding("C2", partition_num=partition_num)
    assert ref.error_names(error.value, "C2", f"partition_num={partition_num!r}")


def test_partition_num_on_an_adaptive_column_is_refused_naming_it(deeprec):
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.categorical_column_with_adaptive_embedding("C4",
                                                                          100,
                                                                          partition_num=2)
    assert ref.error_names(error.value, "C4", "partition_num=2")


def test_ckpt_to_load_from_is_refused_on_an_ev_column(deeprec):
    column = deeprec.feature_column.categorical_column_with_embedding("C3")
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.embedding_column(column, 4, ckpt_to_load_from="/tmp/ckpt")
    assert ref.error_names(error.value, "C3", "ckpt_to_load_from")


def test_ids_of_the_wrong_kind_are_refused_before_any_variable(deeprec, rng):
    batch, ids = _batch(rng, "int64")
    with ref.graph_session():
        column = deeprec.feature_column.embedding_column(
            deeprec.feature_column.categorical_column_with_embedding("C4", dtype=tf.string), 4)
        with pytest.raises(ValueError) as error:
            deeprec.feature_column.input_layer({"C4": _sparse(batch, ids)}, [column])
        assert ref.error_names(error.value, "C4", "string", "int64")
        assert deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES) == []


def test_shared_columns_must_all_be_ev_columns_of_one_key_dtype(deeprec):
    ev64 = deeprec.feature_column.categorical_column_with_embedding("x", dtype=tf.int64)
    ev32 = deeprec.feature_column.categorical_column_with_embedding("y", dtype=tf.int32)
    stock = deeprec.feature_column.categorical_column_with_identity("z", 10)
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.shared_embedding_columns([ev64, stock], 4)
    assert ref.error_names(error.value, "z", "categorical_column_with_embedding")
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.shared_embedding_columns([ev64, ev32], 4)
    assert ref.error_names(error.value, "int32", "int64")


def test_max_norm_in_a_group_is_refused_naming_the_column(deeprec, rng):
    batch, ids = _batch(rng, "int64")
    with ref.graph_session():
        with deeprec.feature_column.group_embedding_column_scope("g"):
            column = deeprec.feature_column.embedding_column(
                deeprec.feature_column.categorical_column_with_embedding("C5", dtype=tf.int64),
                4,
                max_norm=1.0)
        with pytest.raises(ValueError) as error:
            deeprec.feature_column.input_layer({"C5": _sparse(batch, ids)}, [column])
        assert ref.error_names(error.value, "C5_embedding", "max_norm=1.0", "g")
        assert deeprec.get_collection(deeprec.GraphKeys.EMBEDDING_VARIABLES) == []


def test_is_sequence_and_dense_params_are_refused_by_group_lookup(deeprec, sok, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=2)
    ids = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [1, 1])
    with pytest.raises(ValueError, match="is_sequence"):
        tf.nn.group_embedding_lookup_sparse([ev], [ids], ["sum"], is_sequence=True)
    dense = tf.Variable(tf.zeros([3, 2]), name="dense_table")
    with pytest.raises(ValueError) as error:
        tf.nn.group_embedding_lookup_sparse([ev, dense], [ids, ids], ["sum", "sum"])
    assert ref.error_names(error.value, "dense_table", "not an Embedding Variable")


def test_do_fusion_is_accepted_and_changes_nothing(deeprec):
    column = deeprec.feature_column.categorical_column_with_embedding("C6")
    initializer = tf.constant_initializer(1.0)
    fused = deeprec.feature_column.embedding_column(column,
                                                    4,
                                                    initializer=initializer,
                                                    do_fusion=True)
    plain = deeprec.feature_column.embedding_column(column, 4, initializer=initializer)
    assert fused == plain


def test_an_unknown_argument_is_refused_naming_it(deeprec):
    column = deeprec.feature_column.categorical_column_with_embedding("C8")
    with pytest.raises(ValueError) as error:
        deeprec.feature_column.embedding_column(column, 4, steps_to_live=5)
    assert ref.error_names(error.value, "C8", "steps_to_live=5")


def test_stock_columns_still_go_to_tensorflow(deeprec):
    from tensorflow.python.feature_column import feature_column_v2  # pylint: disable=import-outside-toplevel
    identity = deeprec.feature_column.categorical_column_with_identity("i", 10)
    column = deeprec.feature_column.embedding_column(identity, 3)
    assert type(column) is feature_column_v2.EmbeddingColumn  # pylint: disable=unidiomatic-typecheck
