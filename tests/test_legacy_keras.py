"""sok-ev under legacy Keras: TF_USE_LEGACY_KERAS=1 with the tf_keras package.

On TensorFlow 2.21 DeepRec's TF1 scripts need legacy Keras (their
`tf.layers.dense` exists only there). There `tf.keras.optimizers.Optimizer`
is tf_keras's, which has `apply_gradients` but no Keras 3 `apply`. The
environment variable must be set before TensorFlow is imported, so
everything runs in a subprocess (tests/legacy_keras_worker.py), with this
suite's sok_ev first on its path; this module checks what it wrote.

Pinned down:
* `sok_ev.init()` and `sok_ev.install_deeprec_api()` work, and hook tf_keras's
  `Optimizer.apply_gradients`;
* tf_keras's SGD and Adagrad (3 steps), Adam and RMSprop (first step) update an
  Embedding Variable and a dense kernel exactly as the same tf_keras
  optimizer updates a dense tf.Variable holding the same rows (the
  reference), eagerly and in tf.function; the step is counted once;
* a DeepRec TF1 script (tf.compat.v1 Session, kernel from
  `tf.compat.v1.layers.dense`, tf.compat.v1.train SGD and Adagrad) trains
  an Embedding Variable exactly as the same graph trains a dense variable
  holding the same rows (tf_keras's own optimizers do not update dense
  variables in a TF1 graph, so they are not the tool there);
* random ragged batches with duplicate keys and empty samples throughout;
* SGD with global_clipnorm clips the table's and the kernel's gradients by
  their joint norm, as tf_keras does for a dense table;
* tf_keras's LossScaleOptimizer trains a table as SGD alone when the
  gradients are finite, and skips a non-finite step (rows unchanged, the
  step counted, the scale halved) as it does on a dense variable;
* Adam(adaptive_epsilon=True) is refused with a ValueError naming it,
  before the table changes.
"""
import json
import os

import numpy as np
import pytest

import sok_ev_reference as ref

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "legacy_keras_worker.py")
# (optimizer, mode) -> steps compared.
TRAINED = {
    **{
        (name, mode): steps for name, steps in (("sgd", 3), ("sgd_global_clipnorm", 3), ("sgd_loss_scaled", 3), ("adagrad", 3), ("adam", 1), ("rmsprop", 1)) for mode in ("eager", "tf_function")
    },
    ("v1_sgd", "graph"): 3,
    ("v1_adagrad", "graph"): 3,
}


@pytest.fixture(scope="module")
def legacy(tmp_path_factory, seed):
    """What the worker wrote, run once under TF_USE_LEGACY_KERAS=1."""
    path = str(tmp_path_factory.mktemp("legacy_keras") / "out.npz")
    return ref.run_legacy_keras_worker(
        WORKER, path, seed,
        "the legacy Keras worker failed (request.sh installs tf_keras; is it importable?)")


@pytest.fixture(scope="module")
def seed():
    # Module-scoped: one subprocess run serves every test here.
    return int(os.environ.get("SOK_EV_TEST_SEED", "0")) + 55


def _facts(legacy):
    return json.loads(str(legacy["facts"]))


def test_tf_keras_is_the_keras_under_test(legacy):
    facts = _facts(legacy)
    assert facts["keras_optimizer_module"].startswith("tf_keras.")
    assert facts["legacy_keras"] is True
    assert facts["tf_layers_dense"] is True


def test_init_and_install_deeprec_api_hook_tf_keras_apply_gradients(legacy):
    facts = _facts(legacy)
    assert facts["hook_installed"] is True
    assert facts["apply_gradients_hooked"] is True
    assert facts["tf_has_get_embedding_variable"] is True


@pytest.mark.parametrize("optimizer, mode", sorted(TRAINED))
def test_optimizer_updates_an_ev_like_a_dense_variable(legacy, optimizer, mode):
    seen = set()
    for t in range(TRAINED[(optimizer, mode)]):
        seen |= set(int(k) for k in legacy[f"batch_keys/{t}"])
        keys = legacy[f"{optimizer}/{mode}/keys/{t}"]
        assert set(int(k) for k in keys) == seen, f"step {t + 1}: keys stored"
        table = legacy[f"{optimizer}/reference/table/{t}"]
        np.testing.assert_allclose(legacy[f"{optimizer}/{mode}/ev/{t}"],
                                   table[keys],
                                   rtol=2e-6,
                                   atol=2e-6,
                                   err_msg=f"step {t + 1}: Embedding Variable rows")
        np.testing.assert_allclose(legacy[f"{optimizer}/{mode}/kernel/{t}"],
                                   legacy[f"{optimizer}/reference/kernel/{t}"],
                                   rtol=2e-6,
                                   atol=2e-6,
                                   err_msg=f"step {t + 1}: dense kernel")
    if mode != "graph":
        assert int(legacy[f"{optimizer}/{mode}/iterations"]) == TRAINED[(optimizer, mode)]


def test_every_step_moved_the_rows(legacy):
    """The comparison above is not of untouched rows: training changed them."""
    for optimizer, mode in TRAINED:
        keys = legacy[f"{optimizer}/{mode}/keys/0"]
        moved = np.abs(legacy[f"{optimizer}/{mode}/ev/0"] - legacy["matrix"][keys])
        assert np.all(moved.max(axis=1) > 1e-4), (optimizer, mode)


def test_tf_keras_adam_adaptive_epsilon_is_refused_naming_it(legacy):
    message = _facts(legacy)["adaptive_epsilon"]
    assert message.startswith("ValueError: "), message
    assert ref.error_names(message, "Adam", "adaptive_epsilon=True"), message


def test_refusals_leave_the_table_empty(legacy):
    assert _facts(legacy)["rows_after_refusals"] == []


def test_tf_keras_loss_scale_optimizer_skips_a_non_finite_step_as_on_a_dense_variable(legacy):
    """An infinite gradient: the step changes no row and no weight, counts
  in iterations and halves the loss scale, as tf_keras does with a dense
  variable alone; the next, finite step applies SGD to both."""
    facts = _facts(legacy)
    with_table, dense_only = facts["loss_scale_ev"], facts["loss_scale_dense"]
    for got, want in zip(with_table, dense_only):
        assert (got["iterations"], got["loss_scale"],
                got["dense"]) == (want["iterations"], want["loss_scale"], want["dense"])
    assert [s["iterations"] for s in with_table] == [1, 2]
    assert with_table[0]["loss_scale"] == 2.0**7
    np.testing.assert_array_equal(with_table[0]["row"], facts["matrix_row_3"])
    np.testing.assert_allclose(with_table[1]["row"],
                               np.array(facts["matrix_row_3"]) - 0.5,
                               rtol=1e-6)
    assert with_table[1]["dense"] == pytest.approx(0.5)
