"""DeepRec's feature columns on 2 Horovod workers (feature_column_worker.py):
a categorical_column_with_embedding + embedding_column read by input_layer
in a TF1 graph, its Embedding Variable sharded over the workers (its
default target_gpu, -1), trained with Adagrad on each worker's half of the
global batches.

The reference is one worker's training on the global batches: a dense
tf.Variable holding the same rows, read by tf.nn.embedding_lookup_sparse
with the same combiner and optimizer. After each step the union of the
workers' shards must equal its rows at those keys, each key on one worker,
and the keys must be exactly the ids the batches held so far.
Each is run three times: started as sok-ev documents (hvd.init(),
sok_ev.init()); as DeepRec's modelzoo scripts start with --group_embedding
collective (tf.config.experimental.enable_distributed_strategy("collective"),
the column in a group_embedding_column_scope); and with partition_num=3
(DeepRec's partitioned Embedding Variable, each part sharded).
Launched over Gloo on CPUs, over NCCL in GPU mode (harness.GPUS).
"""
import os

import numpy as np
import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = 2

# sok_ev: hvd.init() + sok_ev.init(); collective: DeepRec's
# enable_distributed_strategy("collective") and group_embedding_column_scope;
# partitioned: sok_ev's start, partition_num=3.
LAUNCHES = {
    "sok_ev": ["--init", "sok_ev"],
    "collective": ["--init", "collective"],
    "partitioned": ["--init", "sok_ev", "--partition-num", "3"],
}


@pytest.fixture(scope="module", params=sorted(LAUNCHES))
def results(request):
    harness.require_horovodrun()
    result = harness.launch(os.path.join(HERE, "feature_column_worker.py"),
                            WORKERS,
                            args=LAUNCHES[request.param],
                            timeout=harness.LAUNCH_TIMEOUT)
    return request.param, result.assert_completed(WORKERS).results


def _steps(results):
    steps = sorted({int(k.split("/")[1]) for k in results[0] if k.startswith("sok/")})
    assert steps, "no step was recorded"
    return steps


def test_the_column_table_is_sharded_over_every_worker(results):
    launch, results = results
    assert int(results[0]["parts"]) == (3 if launch == "partitioned" else 1)
    for r in range(WORKERS):
        assert int(results[r]["target_gpu"]) == -1
        assert len(results[r]["sok/0/keys"]) > 0, f"rank {r} owns no key"
        for key in results[r][f"sok/{_steps(results)[-1]}/keys"]:
            assert harness.owner_of(int(key), WORKERS) == r, f"rank {r} holds key {key}"


def test_two_workers_train_the_column_as_one_worker_on_the_global_batch(results):
    _, results = results
    for t in _steps(results):
        harness.assert_shards_equal_twin_rows(results, t, WORKERS)
    # Every id of the batches was stored (the lookups insert), and training
    # moved exactly the reference's rows of those ids.
    last = _steps(results)[-1]
    keys = np.concatenate([results[r][f"sok/{last}/keys"] for r in range(WORKERS)])
    moved = ~np.isclose(results[0][f"twin/{last}/rows"], results[0]["initial_rows"]).all(axis=1)
    assert moved.any(), "training moved no row"
    np.testing.assert_array_equal(np.sort(keys), np.flatnonzero(moved))
