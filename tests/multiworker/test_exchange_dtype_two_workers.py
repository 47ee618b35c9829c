"""lookup_sparse(..., exchange_dtype=...) on 2 Gloo workers (issue 12).

One launch runs every case (compressed_exchange_worker.py): exchange
default / float32 / bfloat16 / float16, tables sharded by key (target_gpu
-1) or whole on worker 1 (target_gpu 1), graph and eager, int64 and int32
keys, duplicates and empty samples (exchange_data.step_data), the sum
combiner and the mean of weighted rows, forward and one SGD step of a linear
loss. References are NumPy (float64) over the known
initial rows, and tf.cast for the rounding:
* float32 is exact: the same bits as no exchange_dtype at all, and the
  NumPy values up to float32's own summation rounding;
* bfloat16 / float16: every exchanged element is rounded once, so each
  forward row equals the NumPy sum of the tf.cast-rounded rows (a worker's
  own rows, which are not exchanged, unrounded), and is within
  eps * sum|x_i| of the float32 result (eps 2^-8 / 2^-11, the bound
  lookup_sparse documents);
* after the step, each stored row is within lr * eps * sum_w |g_w| of the
  float32 step's row, g_w the gradient worker w sent for the key.
"""
import os

import numpy as np
import pytest
import tensorflow as tf

import exchange_data
import harness

HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = 2
EPS = {"float32": 0.0, "default": 0.0, "bfloat16": 2.0**-8, "float16": 2.0**-11}
PLACEMENTS = ("sharded", "worker1")
CASES = [
    f"{exchange}:{placement}:{mode}" for placement in PLACEMENTS
    for exchange in ("default", "float32", "bfloat16", "float16") for mode in ("graph", "eager")
] + [  # weighted mean: the combine's weights scale the bound's terms
    f"{exchange}:{placement}:{mode}:mean" for placement in PLACEMENTS
    for exchange in ("float32", "bfloat16", "float16") for mode in ("graph", "eager")
]
COMPRESSED = [c for c in CASES if c.split(":")[0] in ("bfloat16", "float16")]


@pytest.fixture(scope="module")
def run():
    harness.require_horovodrun()
    result = harness.launch(os.path.join(HERE, "compressed_exchange_worker.py"),
                            WORKERS, ["--cases", ",".join(CASES)],
                            timeout=harness.LAUNCH_TIMEOUT)
    assert not result.timed_out, result.tail()
    assert result.returncode == 0 and len(result.results) == WORKERS, result.tail()
    return result.results


def _combiner(case):
    """"sum", or the fourth field of a case ("mean": weighted mean)."""
    fields = case.split(":")
    return fields[3] if len(fields) > 3 else "sum"


def _rounded(fmt):
    dtype = getattr(tf, fmt)
    return lambda x: tf.cast(tf.cast(x, dtype), tf.float32).numpy()


def _table(results, case, t):
    """{key: stored row} over both shards."""
    return {
        k: v for r in range(WORKERS)
        for k, v in zip(results[r][f"{case}/keys{t}"].tolist(), results[r][f"{case}/values{t}"])
    }


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_float32_exchange_is_bit_exact_as_without_the_option(run, placement, mode):
    """The same outputs and the same stored rows, key by key. The GPU table
    exports in slot order, which concurrent inserts make differ between two
    runs, so the stored tables are compared sorted by key."""
    for r in range(WORKERS):
        for t in range(len(harness.TABLES)):
            np.testing.assert_array_equal(run[r][f"float32:{placement}:{mode}/emb{t}"],
                                          run[r][f"default:{placement}:{mode}/emb{t}"],
                                          err_msg=f"rank {r} emb{t}")
            stored = {}
            for exchange in ("float32", "default"):
                keys = run[r][f"{exchange}:{placement}:{mode}/keys{t}"]
                order = np.argsort(keys, kind="stable")
                stored[exchange] = (keys[order],
                                    run[r][f"{exchange}:{placement}:{mode}/values{t}"][order])
            for name, got, want in zip(("keys", "values"), stored["float32"], stored["default"]):
                np.testing.assert_array_equal(got, want, err_msg=f"rank {r} {name}{t}")


@pytest.mark.parametrize("case", CASES)
def test_forward_is_within_the_documented_bound_of_float32(run, case):
    exchange = case.split(":")[0]
    batches, _ = exchange_data.step_data(WORKERS)
    for r in range(WORKERS):
        for t in range(len(harness.TABLES)):
            expected, magnitude = exchange_data.forward(batches[r][t], t, combiner=_combiner(case))
            got = run[r][f"{case}/emb{t}"]
            bound = (EPS[exchange] + exchange_data.FLOAT32_SLACK) * magnitude
            assert np.all(np.abs(got -
                                 expected) <= bound), (f"rank {r} table {t}: worst excess "
                                                       f"{np.max(np.abs(got - expected) - bound)}")
            np.testing.assert_array_equal(got[exchange_data.EMPTY_SAMPLE], 0.0)


@pytest.mark.parametrize("case", COMPRESSED)
def test_compressed_forward_rounds_each_row_from_another_worker_once_by_tf_cast(run, case):
    """Tighter than the bound: the exchange rounds each element of a row
  another worker owns exactly as tf.cast does, and nothing else changes
  (float32 slack only); the rows a worker owns itself never cross the network
  and stay float32."""
    exchange, placement = case.split(":")[:2]
    batches, _ = exchange_data.step_data(WORKERS)
    for r in range(WORKERS):
        for t in range(len(harness.TABLES)):
            own = exchange_data.owners(batches[r][t], placement, WORKERS) == r
            expected, magnitude = exchange_data.forward(batches[r][t],
                                                        t,
                                                        _rounded(exchange),
                                                        _combiner(case),
                                                        exact=own)
            got = run[r][f"{case}/emb{t}"]
            assert np.all(np.abs(got - expected) <= exchange_data.FLOAT32_SLACK * magnitude)
            # And the rounding happened where rows came from another worker.
            plain, _ = exchange_data.forward(batches[r][t], t, combiner=_combiner(case))
            if not own.all():
                assert np.max(np.abs(got - plain)) > 0, f"rank {r} table {t}"


@pytest.mark.parametrize("case", CASES)
def test_one_sgd_step_is_within_the_documented_bound_of_float32(run, case):
    exchange = case.split(":")[0]
    batches, coefficients = exchange_data.step_data(WORKERS)
    lr = exchange_data.LEARNING_RATE
    for t in range(len(harness.TABLES)):
        stored = _table(run, case, t)
        gradients = exchange_data.key_gradients(batches, coefficients, t, _combiner(case))
        assert set(stored) == set(gradients), f"table {t}"
        worst = -np.inf
        for key, per_worker in gradients.items():
            x = exchange_data.initial_rows(t, [key])[0].astype(np.float64)
            expected = x - lr * np.sum(per_worker, axis=0)
            sent = np.sum(np.abs(per_worker), axis=0)
            bound = (lr * EPS[exchange] * sent + exchange_data.FLOAT32_SLACK *
                     (np.abs(x) + lr * sent))
            worst = max(worst, np.max(np.abs(stored[key] - expected) - bound))
        assert worst <= 0, f"table {t}: a row exceeds its bound by {worst}"


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_compressed_step_differs_from_float32_only_by_rounding(run, placement):
    """The option takes effect in the backward pass too: bfloat16 moves the
  stored rows off the float32 step's, by at most lr * 2^-8 * |g|."""
    float32 = _table(run, f"float32:{placement}:graph", 0)
    bfloat16 = _table(run, f"bfloat16:{placement}:graph", 0)
    differences = [np.max(np.abs(bfloat16[k] - float32[k])) for k in float32]
    assert max(differences) > 0
