"""Embedding Variable creation, graph-mode integration, initial values and keys.

Pinned down:
* attributes: name, embedding_dim, key_dtype, settable target_gpu (default -1);
* names: in a graph, exactly the variable-scope name tf.compat.v1.get_variable
  gives (name scopes ignored), so a checkpoint restores into the same model
  built under a name scope; a name another variable or op has is refused
  as get_variable refuses it; eagerly, the name tf.Variable gets;
* tf.compat.v1 graph mode: variable_scope reuse returns the same variable,
  a second creation without reuse is an error, GLOBAL_VARIABLES /
  TRAINABLE_VARIABLES / `collections=` membership, and
  global_variables_initializer makes it usable;
* argument checks: an empty name, `collections` given as a string, and
  target_gpu / steps_to_live given as a bool are refused naming the argument
  and value, before anything is created; NumPy integers are integers;
* total_count() counts distinct keys; export() returns every stored key once
  with its row;
* initial values: default_value_dim=N gives key k row M[k mod N] exactly;
  the default initializer looks like a truncated normal; a seeded
  initializer draws the same value for a key in two runs;
* every int64 / int32 key value works, or an extreme one is rejected with
  InvalidArgument naming it; never silently wrong values;
* sok_ev.init() is idempotent; sok_ev.install_deeprec_api() provides
  tf.get_embedding_variable and friends.
"""
import contextlib

import numpy as np
import pytest
import tensorflow as tf

import sok_ev_reference as ref

N_ROWS, DIM = 16, 4


def _one_key_per_sample(keys, key_dtype=np.int64):
    """A SparseTensor whose sample i holds keys[i], so lookup 'sum' returns the rows."""
    keys = np.asarray(keys, dtype=key_dtype)
    indices = np.stack([np.arange(len(keys)), np.zeros(len(keys), np.int64)], axis=1)
    return tf.SparseTensor(indices, keys, [len(keys), 1])


def _rows(sok, ev, keys, key_dtype=np.int64):
    return sok.lookup_sparse([ev], [_one_key_per_sample(keys, key_dtype)], combiners=["sum"])[0]


# --------------------------------------------------------------------------- attributes


def test_attributes_reflect_the_creation_arguments(sok, unique_name):
    name = unique_name()
    ev = sok.get_embedding_variable(name, embedding_dim=7, key_dtype=tf.int32)

    assert name in ev.name
    assert ev.embedding_dim == 7
    assert ev.key_dtype == tf.int32
    assert ev.target_gpu == -1  # default: the table lives on the CPU of this worker


def test_key_dtype_defaults_to_int64(sok, unique_name):
    assert sok.get_embedding_variable(unique_name(), embedding_dim=3).key_dtype == tf.int64


def test_target_gpu_is_settable(sok, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=3)
    ev.target_gpu = 0
    assert ev.target_gpu == 0
    ev.target_gpu = -1
    assert ev.target_gpu == -1


def test_init_is_idempotent(sok, rng, unique_name):
    sok.init()
    sok.init()
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix)
    keys = rng.integers(0, 100, size=6)
    np.testing.assert_array_equal(_rows(sok, ev, keys).numpy(), ref.initial_rows(matrix, keys))


# --------------------------------------------------------------------------- graph mode


def test_variable_scope_reuse_returns_the_same_variable(sok):
    with ref.graph_session() as sess:
        with tf.compat.v1.variable_scope("tower"):
            first = sok.get_embedding_variable("emb",
                                               embedding_dim=DIM,
                                               initializer=tf.ones_initializer())
        with tf.compat.v1.variable_scope("tower", reuse=True):
            again = sok.get_embedding_variable("emb", embedding_dim=DIM)
        with tf.compat.v1.variable_scope("tower", reuse=tf.compat.v1.AUTO_REUSE):
            auto = sok.get_embedding_variable("emb", embedding_dim=DIM)
        assert again.name == first.name == auto.name == "tower/emb:0"
        # One table behind all three handles: train through one, read through the others.
        loss = tf.reduce_sum(_rows(sok, first, [5]))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        read_again, read_auto = _rows(sok, again, [5]), _rows(sok, auto, [5])
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train_op)
        # ones - 0.5 * 1: exact in float32.
        np.testing.assert_array_equal(sess.run(read_again), np.full((1, DIM), 0.5, np.float32))
        np.testing.assert_array_equal(sess.run(read_auto), np.full((1, DIM), 0.5, np.float32))
        assert len([v for v in tf.compat.v1.global_variables() if v.name == first.name]) == 1


# How the scopes are opened, the name an op "c" gets there (the name scope),
# and the name tf.compat.v1.get_variable gives "w" there (the variable scope).
SCOPES = {
    "variable_scope": (lambda: [tf.compat.v1.variable_scope("s")], "s/c:0", "s/w:0"),
    # After a first entry (made by the test), "s" opens name scope "s_1".
    "variable_scope_reentered":
        (lambda: [tf.compat.v1.variable_scope("s", reuse=tf.compat.v1.AUTO_REUSE)], "s_1/c:0",
         "s/w:0"),
    "name_scope_only": (lambda: [tf.compat.v1.name_scope("tower")], "tower/c:0", "w:0"),
    "name_scope_in_variable_scope":
        (lambda: [tf.compat.v1.variable_scope("s"),
                  tf.compat.v1.name_scope("tower")], "s/tower/c:0", "s/w:0"),
    "nested_variable_scopes":
        (lambda: [tf.compat.v1.variable_scope("a"),
                  tf.compat.v1.variable_scope("b")], "a/b/c:0", "a/b/w:0"),
}


@pytest.mark.parametrize("scopes", sorted(SCOPES))
def test_graph_name_is_the_variable_scope_name_as_for_get_variable(sok, scopes):
    open_scopes, op_name, dense_name = SCOPES[scopes]
    with ref.graph_session():
        if scopes == "variable_scope_reentered":  # a first entry, as a model would
            with tf.compat.v1.variable_scope("s"):
                tf.compat.v1.get_variable("first", [1])
        with contextlib.ExitStack() as stack:
            for scope in open_scopes():
                stack.enter_context(scope)
            assert tf.constant(0.0, name="c").name == op_name
            dense = tf.compat.v1.get_variable("w", [1])  # the reference
            ev = sok.get_embedding_variable("emb", embedding_dim=DIM)
        assert dense.name == dense_name
        assert ev.name == dense_name.replace("w:0", "emb:0")
        # The handle op and the table's shared name are the name: the
        # checkpoint key and what sessions share.
        assert ev.op.name == ev.name[:-len(":0")]
        assert ev.op.get_attr("shared_name") == ev.op.name.encode()
        assert ev.initializer.name.startswith(ev.op.name + "/")


def test_checkpoint_restores_into_the_same_model_built_under_a_name_scope(sok, tmp_path):
    """An evaluation graph is often built under a name scope: as for a dense
  get_variable, the Embedding Variable keeps its name and restores."""

    def model():
        with tf.compat.v1.variable_scope("s"):
            ev = sok.get_embedding_variable("emb",
                                            embedding_dim=2,
                                            initializer=tf.ones_initializer())
            dense = tf.compat.v1.get_variable("w", [2], initializer=tf.ones_initializer())
        return ev, dense

    prefix = str(tmp_path / "model")
    with ref.graph_session() as sess:
        ev, dense = model()
        loss = tf.reduce_sum(tf.nn.embedding_lookup(ev, tf.constant([7], tf.int64)))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        saver = tf.compat.v1.train.Saver()
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train_op)
        saver.save(sess, prefix)
        saved_names = (ev.name, dense.name)
    with ref.graph_session() as sess:
        with tf.compat.v1.name_scope("eval"):
            ev, dense = model()
        assert (ev.name, dense.name) == saved_names == ("s/emb:0", "s/w:0")
        tf.compat.v1.train.Saver().restore(sess, prefix)
        keys, rows = sess.run(ev.export())
    # ones - 0.5 * 1: exact in float32.
    assert ref.export_to_dict(keys, rows).keys() == {7}
    np.testing.assert_array_equal(ref.export_to_dict(keys, rows)[7], [0.5, 0.5])


TAKEN = {
    "get_variable":
        lambda: tf.compat.v1.get_variable("emb", [2]),
    "tf_variable":
        lambda: tf.Variable([1.0], name="emb"),
    "partitioned_get_variable":
        lambda: tf.compat.v1.get_variable("emb", [4, 2],
                                          partitioner=tf.compat.v1.fixed_size_partitioner(2)),
}


@pytest.mark.parametrize("reuse", [None, tf.compat.v1.AUTO_REUSE], ids=["no_reuse", "auto_reuse"])
@pytest.mark.parametrize("taken_by", sorted(TAKEN))
def test_a_name_another_variable_has_is_refused_as_get_variable_does(sok, taken_by, reuse):
    with ref.graph_session() as sess:
        TAKEN[taken_by]()
        if taken_by == "get_variable":  # the reference: stock TF refuses a second "emb"
            with pytest.raises(ValueError, match="Variable emb already exists"):
                tf.compat.v1.get_variable("emb", [3])
        ops_before = len(sess.graph.get_operations())
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=reuse):
            with pytest.raises(ValueError) as error:
                sok.get_embedding_variable("emb", embedding_dim=DIM)
        assert len(sess.graph.get_operations()) == ops_before  # nothing was created
        assert not tf.compat.v1.get_collection(sok.embedding_variable.EMBEDDING_VARIABLES)
    assert ref.error_names(error.value, "Variable emb already exists", "reuse")


def test_get_variable_of_an_embedding_variables_name_is_refused_as_for_a_variable(sok):
    # The reference: stock TF refuses a second get_variable("tower/emb").
    with ref.graph_session():
        with tf.compat.v1.variable_scope("tower"):
            tf.compat.v1.get_variable("emb", [3])
            with pytest.raises(ValueError) as dense_error:
                tf.compat.v1.get_variable("emb", [3])
    with ref.graph_session():
        with tf.compat.v1.variable_scope("tower"):
            ev = sok.get_embedding_variable("emb", embedding_dim=DIM)
            with pytest.raises(ValueError) as error:
                tf.compat.v1.get_variable("emb", [3])
        with tf.compat.v1.variable_scope("tower", reuse=True):
            assert tf.compat.v1.get_variable("emb") is ev
        assert tf.compat.v1.global_variables() == [ev]
    assert ref.error_names(dense_error.value, "Variable tower/emb already exists")
    assert ref.error_names(error.value, "Variable tower/emb already exists")


def test_a_name_a_graph_op_has_is_refused_naming_it(sok):
    with ref.graph_session():
        tf.constant(1.0, name="emb")
        with pytest.raises(ValueError) as error:
            sok.get_embedding_variable("emb", embedding_dim=DIM)
    assert ref.error_names(error.value, "emb", "Const")


def test_a_later_op_of_the_same_name_gets_a_suffix(sok):
    # The handle op keeps the name; stock TF renames what comes after.
    with ref.graph_session():
        ev = sok.get_embedding_variable("emb", embedding_dim=DIM)
        assert tf.constant(1.0, name="emb").name == "emb_1:0"
        assert ev.op.name == "emb"


def test_eager_name_is_the_name_tf_variable_gets(sok, unique_name):
    name = unique_name()
    with tf.name_scope("tower"):
        ev = sok.get_embedding_variable(name, embedding_dim=DIM)
        dense = tf.Variable([1.0], name=name)  # the reference
    assert ev.name == dense.name == f"tower/{name}:0"
    with tf.compat.v1.variable_scope("s"):
        ev = sok.get_embedding_variable(name, embedding_dim=DIM)
        dense = tf.Variable([1.0], name=name)
    assert ev.name == dense.name == f"s/{name}:0"


def test_creating_the_same_name_twice_without_reuse_raises(sok):
    with ref.graph_session():
        with tf.compat.v1.variable_scope("tower"):
            sok.get_embedding_variable("emb", embedding_dim=DIM)
        with tf.compat.v1.variable_scope("tower"):
            with pytest.raises(ValueError) as error:
                sok.get_embedding_variable("emb", embedding_dim=DIM)
    assert ref.error_names(error.value, "tower/emb")


def test_reuse_of_a_missing_variable_raises(sok):
    with ref.graph_session():
        with tf.compat.v1.variable_scope("tower", reuse=True):
            with pytest.raises(ValueError) as error:
                sok.get_embedding_variable("never_created", embedding_dim=DIM)
    assert ref.error_names(error.value, "tower/never_created")


def test_trainable_ev_is_in_global_and_trainable_collections(sok):
    with ref.graph_session():
        ev = sok.get_embedding_variable("emb", embedding_dim=DIM)
        assert ev in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        assert ev in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        assert ev in tf.compat.v1.trainable_variables()


def test_non_trainable_ev_is_global_but_not_trainable(sok):
    with ref.graph_session():
        ev = sok.get_embedding_variable("emb", embedding_dim=DIM, trainable=False)
        assert ev in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        assert ev not in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)


def test_collections_argument_is_honoured(sok):
    with ref.graph_session():
        ev = sok.get_embedding_variable("emb",
                                        embedding_dim=DIM,
                                        collections=["my_tables", "more_tables"])
        assert ev in tf.compat.v1.get_collection("my_tables")
        assert ev in tf.compat.v1.get_collection("more_tables")


def test_collections_given_as_a_string_is_refused_before_anything_is_created(sok):
    with ref.graph_session():
        # The reference: stock TF refuses it too.
        with pytest.raises(ValueError, match="collections"):
            tf.compat.v1.get_variable("dense", [2], collections="my_tables")
        with pytest.raises(ValueError) as error:
            sok.get_embedding_variable("emb", embedding_dim=DIM, collections="my_tables")
        assert not tf.compat.v1.global_variables()
        for collection in ("my_tables", "m", "y"):
            assert not tf.compat.v1.get_collection(collection)
    assert ref.error_names(error.value, "emb", "collections", "'my_tables'")


def test_global_variables_initializer_initializes_the_ev(sok, rng):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    keys = rng.integers(-50, 50, size=10)
    with ref.graph_session() as sess:
        ev = ref.matrix_ev(sok, "emb", matrix)
        rows = _rows(sok, ev, keys)
        sess.run(tf.compat.v1.global_variables_initializer())
        np.testing.assert_array_equal(sess.run(rows), ref.initial_rows(matrix, keys))


def test_ev_reports_initialized_after_global_variables_initializer(sok):
    # MonitoredTrainingSession's Scaffold waits on report_uninitialized_variables().
    with ref.graph_session() as sess:
        ev = sok.get_embedding_variable("emb", embedding_dim=DIM)
        report = tf.compat.v1.report_uninitialized_variables()
        assert ev in tf.compat.v1.global_variables()
        assert sess.run(report).size == 1  # the EV is the graph's only variable
        sess.run(tf.compat.v1.global_variables_initializer())
        assert sess.run(report).size == 0


# --------------------------------------------------------------------------- argument checks


def test_an_empty_name_is_refused_naming_the_argument(sok):
    with ref.graph_session():
        with pytest.raises(ValueError) as error:
            sok.get_embedding_variable("", embedding_dim=DIM)
        assert not tf.compat.v1.global_variables()
    assert ref.error_names(error.value, "name", "''")


@pytest.mark.parametrize("argument", ["target_gpu", "steps_to_live"])
def test_a_bool_for_an_integer_argument_is_refused_with_type_error(sok, argument):
    # bool is an int in Python: True would silently mean 1.
    with ref.graph_session():
        with pytest.raises(TypeError) as error:
            sok.get_embedding_variable("emb", embedding_dim=DIM, **{argument: True})
        assert not tf.compat.v1.global_variables()
    assert ref.error_names(error.value, "emb", argument, "True")


def test_a_bool_steps_to_live_in_global_step_evict_is_refused_with_type_error(sok):
    option = sok.EmbeddingVariableOption(evict_option=sok.GlobalStepEvict(steps_to_live=True))
    with ref.graph_session():
        with pytest.raises(TypeError) as error:
            sok.get_embedding_variable("emb", embedding_dim=DIM, ev_option=option)
    assert ref.error_names(error.value, "evict_option.steps_to_live", "True")


def test_numpy_integers_are_accepted_for_every_integer_argument(sok, rng):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    keys = rng.integers(-100, 100, size=10)
    option = sok.EmbeddingVariableOption(
        init_option=sok.InitializerOption(default_value_dim=np.int64(N_ROWS)),
        filter_option=sok.CounterFilter(filter_freq=np.int32(0)))
    with ref.graph_session() as sess:
        ev = sok.get_embedding_variable("emb",
                                        embedding_dim=np.int64(DIM),
                                        initializer=tf.constant_initializer(matrix),
                                        steps_to_live=np.int64(5),
                                        target_gpu=np.int32(0),
                                        ev_option=option)
        assert (ev.embedding_dim, ev.steps_to_live, ev.target_gpu) == (DIM, 5, 0)
        assert option.init_option.default_value_dim == N_ROWS
        rows = _rows(sok, ev, keys)
        sess.run(tf.compat.v1.global_variables_initializer())
        np.testing.assert_array_equal(sess.run(rows), ref.initial_rows(matrix, keys))


# --------------------------------------------------------------------------- count and export


def test_total_count_counts_distinct_keys_in_eager_mode(sok, rng, unique_name):
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=DIM)
    assert int(ev.total_count()) == 0
    seen = set()
    for _ in range(5):
        keys = rng.integers(0, 40, size=12)  # repeats within and across batches
        _rows(sok, ev, keys)
        seen |= set(keys.tolist())
        assert int(ev.total_count()) == len(seen)
    _rows(sok, ev, sorted(seen))  # only old keys: no growth
    assert int(ev.total_count()) == len(seen)


def test_total_count_counts_distinct_keys_in_graph_mode(sok):
    with ref.graph_session() as sess:
        ev = sok.get_embedding_variable("emb", embedding_dim=DIM, key_dtype=tf.int32)
        keys = tf.compat.v1.placeholder(tf.int32, [None])
        indices = tf.stack(
            [tf.range(tf.size(keys, out_type=tf.int64)),
             tf.zeros_like(keys, tf.int64)], axis=1)
        sp = tf.SparseTensor(indices, keys, tf.stack([tf.size(keys, out_type=tf.int64), 1]))
        rows = sok.lookup_sparse([ev], [sp], combiners=["sum"])[0]
        count = ev.total_count()
        sess.run(tf.compat.v1.global_variables_initializer())
        assert sess.run(count) == 0
        for batch, expected in [([1, 2, 3], 3), ([2, 3], 3), ([3, 4, 4, 5], 5), ([1], 5),
                                ([-7, 9], 7)]:
            sess.run(rows, {keys: batch})
            assert sess.run(count) == expected, f"after {batch}"


@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES, ids=["int32", "int64"])
def test_export_returns_every_stored_key_once_with_its_row(sok, rng, unique_name, key_dtype):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype)
    keys = rng.integers(-1000, 1000, size=30).astype(key_dtype)
    _rows(sok, ev, keys, key_dtype)

    exported_keys, exported_values = ev.export()

    assert exported_keys.dtype == tf.as_dtype(key_dtype)
    got = ref.export_to_dict(exported_keys.numpy(), exported_values.numpy())
    assert sorted(got) == sorted(set(keys.tolist()))
    for k, row in got.items():
        np.testing.assert_array_equal(row, ref.initial_rows(matrix, [k])[0])


# --------------------------------------------------------------------------- initial values


@pytest.mark.parametrize("key_dtype", ref.KEY_DTYPES, ids=["int32", "int64"])
def test_default_value_dim_gives_key_row_key_mod_n_exactly(sok, rng, unique_name, key_dtype):
    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype)
    info = np.iinfo(key_dtype)
    keys = np.concatenate(
        [np.arange(N_ROWS),
         rng.integers(info.min, info.max, size=40, dtype=np.int64)]).astype(key_dtype)

    rows = _rows(sok, ev, keys, key_dtype).numpy()

    # Python's % (NumPy's mod) is the non-negative remainder, DeepRec's rule.
    np.testing.assert_array_equal(rows, matrix[np.mod(keys.astype(np.int64), N_ROWS)])


def test_default_initializer_is_deeprecs_truncated_normal_of_stddev_1(sok, rng, unique_name):
    # DeepRec's get_embedding_variable defaults to TF1's
    # truncated_normal_initializer(): mean 0, stddev 1, cut at 2 sigma.
    ev = sok.get_embedding_variable(unique_name(), embedding_dim=16)
    keys = rng.choice(10**9, size=4000, replace=False)
    values = _rows(sok, ev, keys).numpy().reshape(-1).astype(np.float64)

    # A normal truncated at 2 sigma has std 0.8796 sigma and puts 28.47% of its
    # mass beyond 1 sigma.
    sigma = values.std() / 0.8796
    assert abs(sigma - 1.0) < 0.03
    assert np.abs(values).max() <= 2 * sigma * 1.02  # nothing beyond 2 sigma
    assert np.abs(values).max() >= 1.9 * sigma  # but the tails reach it
    assert abs(values.mean()) <= 5 * values.std() / np.sqrt(values.size)  # mean 0
    assert abs(np.mean(np.abs(values) > sigma) - 0.2847) < 0.02  # the shape


def test_seeded_initializer_draws_the_same_values_in_two_runs(sok, rng):
    keys = rng.choice(10**6, size=300, replace=False)

    def initial_values(seed):
        with ref.graph_session() as sess:
            ev = sok.get_embedding_variable("emb",
                                            embedding_dim=8,
                                            initializer=tf.compat.v1.truncated_normal_initializer(
                                                stddev=0.5, seed=seed))
            rows = _rows(sok, ev, keys)
            sess.run(tf.compat.v1.global_variables_initializer())
            return sess.run(rows)

    first, second, other_seed = initial_values(42), initial_values(42), initial_values(43)

    np.testing.assert_array_equal(first, second)
    assert not np.allclose(first, other_seed)  # the seed is actually used
    assert np.abs(first).max() <= 2 * 0.5  # the stddev is honoured (truncated at 2 sigma)
    assert 0.35 < first.std() < 0.53  # 0.8796 * 0.5 = 0.44, 2400 samples


def test_constant_initializer_fills_every_new_key(sok, rng, unique_name):
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=5,
                                    initializer=tf.constant_initializer(-2.5))
    keys = rng.integers(-10**12, 10**12, size=20)
    np.testing.assert_array_equal(_rows(sok, ev, keys).numpy(), np.full((20, 5), -2.5, np.float32))


def test_v1_random_uniform_initializer_with_its_defaults_draws_from_0_to_1(sok, rng, unique_name):
    """tf.compat.v1.random_uniform_initializer() has maxval=None, which
  TensorFlow draws as 1 for floats."""
    ev = sok.get_embedding_variable(unique_name(),
                                    embedding_dim=8,
                                    initializer=tf.compat.v1.random_uniform_initializer(seed=3))
    values = _rows(sok, ev, rng.choice(10**9, size=500, replace=False)).numpy()
    reference = tf.compat.v1.random_uniform_initializer(seed=3)([500, 8]).numpy()
    assert values.min() >= 0.0 and values.max() < 1.0
    assert abs(values.mean() - reference.mean()) < 0.03  # both 0.5 +- 0.013 (4000 draws)


# --------------------------------------------------------------------------- key values

INT64, INT32 = np.iinfo(np.int64), np.iinfo(np.int32)
EXTREME_KEYS = [(np.int64, 0), (np.int64, -1), (np.int64, INT64.min), (np.int64, INT64.max),
                (np.int64, INT64.min + 1), (np.int64, INT64.max - 1), (np.int32, 0), (np.int32, -1),
                (np.int32, INT32.min), (np.int32, INT32.max)]


@pytest.mark.parametrize("key_dtype,key",
                         EXTREME_KEYS,
                         ids=[f"{np.dtype(d).name}_{k}" for d, k in EXTREME_KEYS])
def test_extreme_key_works_or_is_rejected_by_name(sok, rng, unique_name, key_dtype, key):
    """Either every key value is a valid key, or a reserved one fails loudly.

    Silent corruption (a reserved key aliasing another key or an empty
    slot) is the failure this test exists to catch.
    """
    matrix = ref.random_matrix(rng, 7, DIM)
    ev = ref.matrix_ev(sok, unique_name(), matrix, key_dtype)
    others = rng.choice(np.arange(1, 1000), size=5, replace=False)
    keys = np.array([key, *others, key], dtype=key_dtype)  # the extreme key twice
    sp = _one_key_per_sample(keys, key_dtype)
    opt = tf.compat.v1.train.GradientDescentOptimizer(0.5)

    try:
        with tf.GradientTape() as tape:
            rows = sok.lookup_sparse([ev], [sp], combiners=["sum"])[0]
            loss = tf.reduce_sum(rows)
        opt.apply_gradients(zip(tape.gradient(loss, [ev]), [ev]))
    except tf.errors.InvalidArgumentError as error:
        assert str(key) in str(error), f"the rejection must name key {key}: {error}"
        # The other keys are unaffected by the rejected batch.
        np.testing.assert_array_equal(
            _rows(sok, ev, others, key_dtype).numpy(), ref.initial_rows(matrix, others))
        assert key not in ref.export_to_dict(*[t.numpy() for t in ev.export()])
        return

    np.testing.assert_array_equal(rows.numpy(), ref.initial_rows(matrix, keys))
    # One SGD step on sum(rows): key k moves by -0.5 * (its occurrences).
    stored = ref.export_to_dict(*[t.numpy() for t in ev.export()])
    assert sorted(stored) == sorted(set(keys.tolist()))
    for k in stored:
        expected = ref.initial_rows(matrix, [k])[0] - np.float32(0.5 * np.sum(keys == k))
        np.testing.assert_allclose(stored[k], expected, rtol=1e-6, atol=1e-6, err_msg=f"key {k}")
    assert int(ev.total_count()) == len(stored)


# --------------------------------------------------------------------------- DeepRec API


def test_install_deeprec_api_provides_tf_get_embedding_variable(sok, rng):
    sok.install_deeprec_api()
    for module in (tf, tf.compat.v1):
        assert callable(module.get_embedding_variable)
        assert callable(module.EmbeddingVariableOption)
        assert callable(module.InitializerOption)

    matrix = ref.random_matrix(rng, N_ROWS, DIM)
    keys = rng.integers(-100, 100, size=12)
    with ref.graph_session() as sess:
        with tf.compat.v1.variable_scope("deeprec"):
            ev = tf.compat.v1.get_embedding_variable(
                "emb",
                embedding_dim=DIM,
                initializer=tf.constant_initializer(matrix),
                ev_option=tf.compat.v1.EmbeddingVariableOption(
                    init_option=tf.compat.v1.InitializerOption(default_value_dim=N_ROWS)))
        assert ev in tf.compat.v1.trainable_variables()
        rows = _rows(sok, ev, keys)
        sess.run(tf.compat.v1.global_variables_initializer())
        np.testing.assert_array_equal(sess.run(rows), ref.initial_rows(matrix, keys))


@pytest.mark.parametrize("setting", ["partitioner", "regularizer"])
def test_a_scope_partitioner_or_regularizer_it_ignores_is_named_in_a_warning(sok, caplog, setting):
    # Scopes set these for their dense layers too: the script runs, and the
    # user is told what does not apply to the Embedding Variable.
    value = {
        "partitioner": tf.compat.v1.fixed_size_partitioner(2),
        "regularizer": tf.keras.regularizers.l2(0.1)
    }[setting]
    with ref.graph_session():
        with tf.compat.v1.variable_scope("tower", **{setting: value}):
            ev = sok.get_embedding_variable("emb", embedding_dim=DIM)
    assert isinstance(ev, sok.EmbeddingVariable)
    assert any(
        setting in r.getMessage() and "'tower'" in r.getMessage() and "'emb'" in r.getMessage()
        for r in caplog.records)
