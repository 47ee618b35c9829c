"""Embedding Variable gradients are never allreduced: each way a script could
do it raises a ValueError naming the variable, in graph and eager mode --
also allreducing only a gradient's values (keeping its indices), with an
allreduce bound before sok_ev.init(), with Horovod's inner function bound
before it (eagerly), or with Horovod's raw op or a reduction of a gradient
made anew (caught where the optimizer applies the gradient: in a graph by
the Horovod op on its way, eagerly by the other workers' keys it holds).

Each worker's Embedding Variable gradient already holds, for the keys it
owns, every worker's contributions (the lookup's backward alltoall routes
them); an allreduce would apply keys into shards that do not own them. The
messages were recorded by lookup_worker.record_guards on 2 workers.
"""
import pytest

GUARDED = {
    "graph_distributed_optimizer": "hvd.DistributedOptimizer would reduce",
    "graph_allreduce": "hvd.allreduce would reduce",
    "graph_grouped_allreduce": "hvd.grouped_allreduce would reduce",
    "graph_values_only": "hvd.allreduce would reduce",
    "graph_bound_before_init": "would reduce the gradient",
    "graph_raw_op": "Horovod's allreduce op would reduce",
    "graph_raw_reduction_at_apply": "went through Horovod op",
    "eager_distributed_tape": "hvd.DistributedGradientTape.gradient would reduce",
    "eager_allreduce": "hvd.allreduce would reduce",
    "eager_values_only": "hvd.allreduce would reduce",
    "eager_bound_before_init": "would reduce the gradient",
    "eager_raw_op": "Horovod's allreduce op would reduce",
    "eager_reduced_at_apply": "no longer the lookup's own",
}


@pytest.mark.parametrize("way", sorted(GUARDED))
def test_allreducing_an_embedding_gradient_raises(lookup_run, way):
    result = lookup_run(2)
    for rank in range(2):
        message = str(result.results[rank][f"guard/{way}"])
        assert GUARDED[way] in message, message
        assert "Embedding Variable" in message and "'t0:0'" in message
        assert "dense" in message  # says what to do instead


def test_allreduce_bound_before_init_leaves_the_shard_unchanged(lookup_run):
    result = lookup_run(2)
    for rank in range(2):
        assert bool(result.results[rank]["guard/eager_shard_unchanged"])


def test_allreducing_only_dense_gradients_is_accepted(lookup_run):
    result = lookup_run(2)
    for rank in range(2):
        assert str(result.results[rank]["guard/graph_dense_only"]) == ""
