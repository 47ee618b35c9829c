"""Keras's fit on 2 Horovod workers (keras_fit_worker.py), with Keras 3 and
with tf_keras (TF_USE_LEGACY_KERAS=1): sok_ev.keras.DistributedOptimizer
and sok_ev.keras.BroadcastGlobalVariablesCallback.

The reference is one worker's fit of the global batches: the same model on
keras.layers.Embedding holding the same rows, trained by each rank alone on
every sample. After each step the union of the workers' shards must equal
its table (each key on one worker only), and every worker's dense head must
equal its head: the dense gradients were averaged, the tables' gradients
summed at their owners and divided by the worker count. Rank 1 starts from
another head: the broadcast gives it rank 0's before the first step. Then
the same again with global_clipnorm, and with the LossScaleOptimizer around
the Adagrad.
Launched over Gloo on CPUs, over NCCL in GPU mode (harness.GPUS).
"""
import os

import numpy as np
import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = 2
KERAS = {"keras3": {}, "tf_keras": {"TF_USE_LEGACY_KERAS": "1"}}


@pytest.fixture(scope="module", params=sorted(KERAS))
def launch(request):
    harness.require_horovodrun()
    result = harness.launch(os.path.join(HERE, "keras_fit_worker.py"),
                            WORKERS,
                            timeout=harness.LAUNCH_TIMEOUT,
                            env=KERAS[request.param])
    return request.param, result.assert_completed(WORKERS).results


def _steps(results):
    steps = sorted({int(k.split("/")[1]) for k in results[0] if k.startswith("twin/")})
    assert steps, "no step was recorded"
    return steps


def test_each_keras_ran(launch):
    keras, results = launch
    module = str(results[0]["keras"])
    assert module.startswith("tf_keras.") if keras == "tf_keras" else module.startswith("keras.")


def _assert_fit_equals_one_worker(results, suffix=""):
    """After every step, the workers' shards of the table (prefix
  sok<suffix>/) hold the one-worker twin's rows (twin<suffix>/), every
  worker's head is the twin's, and Keras counted the step."""
    sok, twin = "sok" + suffix, "twin" + suffix
    for t in _steps(results):
        harness.assert_shards_equal_twin_rows(results, t, WORKERS, sok, twin)
        for r in range(WORKERS):
            for field in ("kernel", "bias"):
                np.testing.assert_allclose(results[r][f"{sok}/{t}/{field}"],
                                           results[0][f"{twin}/{t}/{field}"],
                                           rtol=2e-5,
                                           atol=2e-6,
                                           err_msg=f"rank {r} step {t}: {field}")
            assert int(results[r][f"{sok}/{t}/iterations"]) == t + 1
            assert int(results[r][f"{sok}/{t}/batch"]) == t


def test_two_worker_fit_equals_one_worker_on_the_global_batch_step_for_step(launch):
    _, results = launch
    _assert_fit_equals_one_worker(results)
    # The last step's table is not the initial one: training moved it.
    last = _steps(results)[-1]
    assert not np.allclose(results[0][f"twin/{last}/rows"], results[0]["twin/0/rows"])


def test_two_worker_fit_with_a_loss_scale_optimizer_equals_one_worker_step_for_step(launch):
    """The LossScaleOptimizer (Keras 3's, tf_keras's) around the
  data-parallel Adagrad: the workers agree on every step's finite check and
  scale, and train as one worker on the global batch."""
    _, results = launch
    _assert_fit_equals_one_worker(results, "_loss_scaled")


def test_two_worker_fit_with_global_clipnorm_equals_one_worker_step_for_step(launch):
    """global_clipnorm on the data-parallel Adagrad: every worker scales by
  the joint norm of the head's averaged gradient and of the whole table's
  (its shards' parts summed over the workers), as one worker on the global
  batch does."""
    _, results = launch
    _assert_fit_equals_one_worker(results, "_global_clipnorm")


def test_every_worker_holds_a_shard_of_the_table(launch):
    _, results = launch
    for r in range(WORKERS):
        assert len(results[r]["sok/0/keys"]) > 0, f"rank {r} owns no key"


def test_the_broadcast_replaced_rank_1s_head_before_the_first_step(launch):
    _, results = launch
    assert not np.allclose(results[1]["initial_kernel"], results[0]["initial_kernel"])
    np.testing.assert_array_equal(results[1]["sok/0/kernel"], results[0]["sok/0/kernel"])
