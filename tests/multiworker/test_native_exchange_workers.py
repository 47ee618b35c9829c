"""The row messages over sok-ev's own NCCL exchange (the default on GPUs)
or Horovod's all-to-all (SOK_EV_ROW_TRANSPORT=horovod), on real workers.

* On GPUs (one per rank), every case of lookup_worker.py -- sharded, whole
  and mixed tables, graph, tf.function and packed lookups (several lookups a
  step: one communicator each), empty and duplicated batches, 1 to 3
  workers -- gives by default, its graph steps carrying the rows both ways
  through NcclAlltoall, what the same launch over Horovod gives (both are
  checked against the dense reference by test_model_parallel.py).
* On CPU workers SOK_EV_ROW_TRANSPORT=nccl is refused on every worker at
  build time, naming the variable, before any exchange.
"""
import os
import re

import numpy as np
import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))


def _in_key_order(results, name):
    """results[name], a table shard's export (keys, values or frequencies)
  in key order: a GPU table exports in the order its keys were inserted,
  which concurrent inserts make vary from run to run."""
    case, field = name.rsplit("/", 1)
    table = re.sub(r"^\D+", "", field)
    return results[name][np.argsort(results[f"{case}/keys{table}"], kind="stable")]


def _compare(got, expected, what):
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


@pytest.mark.parametrize("workers", sorted(harness.CASES))
def test_gpu_lookups_carry_rows_over_nccl_by_default_giving_what_horovod_gives(lookup_run, workers):
    if not harness.GPUS:
        pytest.skip("NCCL carries rows between GPUs; on CPU workers the transport is refused "
                    "(test_nccl_row_transport_refuses_tables_on_the_cpu)")
    native = lookup_run(workers)
    reference = lookup_run(workers, "horovod")
    for r in range(workers):
        assert sorted(native.results[r]) == sorted(reference.results[r])
        for name, expected in reference.results[r].items():
            field = name.rsplit("/", 1)[-1]
            if field == "nccl_exchanges":
                continue
            if re.sub(r"\d+$", "", field) in ("keys", "values", "frequencies"):
                _compare(_in_key_order(native.results[r], name),
                         _in_key_order(reference.results[r], name), f"worker {r}: {name}")
            else:
                _compare(native.results[r][name], expected, f"worker {r}: {name}")
        for case in harness.CASES[workers]:
            if case.endswith(":graph"):
                # The rows out and their gradients back.
                assert int(native.results[r][f"{case}/nccl_exchanges"]) == 2, case
                assert int(reference.results[r][f"{case}/nccl_exchanges"]) == 0, case


def test_nccl_row_transport_refuses_tables_on_the_cpu():
    if harness.GPUS:
        pytest.skip("GPU mode places the tables on the GPUs")
    harness.require_horovodrun()
    result = harness.launch(os.path.join(HERE, "lookup_worker.py"),
                            2, ["--cases", "random:sharded:graph"],
                            timeout=harness.LAUNCH_TIMEOUT,
                            env={"SOK_EV_ROW_TRANSPORT": "nccl"})
    assert not result.timed_out, result.tail()
    assert result.returncode != 0 and not result.results, result.tail()
    for rank in range(2):
        assert (f"[{rank}]<stderr>:ValueError: lookup_sparse: SOK_EV_ROW_TRANSPORT=nccl carries "
                "rows between GPUs" in result.output), result.tail()
