"""DeepRec's smart staging names, accepted with the result unchanged.

DeepRec's `tf.staged(features, num_threads=..., capacity=...)` moves the
input pipeline's output through a staging area filled ahead of the step, and
`tf.make_prefetch_hook()` starts the threads that fill it: an optimisation
that changes no value. On stock TensorFlow the input pipeline's own
`dataset.prefetch` does that prefetching, so `staged` returns its input's
values (identities, so the structure and tensors are those given) and the
hook does nothing.
"""

import tensorflow as tf


def staged(features,
           feed_list=None,
           feed_generator=None,
           capacity=1,
           num_threads=1,
           items=None,
           closed_exception_types=None,
           ignore_errors=False,
           use_stage_subgraph_thread_pool=False,
           stage_subgraph_thread_pool_id=0,
           stage_subgraph_stream_id=0,
           name=None):
    """`features` unchanged (each tensor through tf.identity).

  Raises:
    ValueError: capacity or num_threads is not a positive integer.
  """
    del feed_list, feed_generator, items, closed_exception_types, ignore_errors
    del use_stage_subgraph_thread_pool, stage_subgraph_thread_pool_id, stage_subgraph_stream_id
    for argument, value in (("capacity", capacity), ("num_threads", num_threads)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"tf.staged: {argument} must be an integer >= 1, got {value!r}")
    with tf.name_scope(name or "staged"):
        return tf.nest.map_structure(lambda t: tf.identity(t)
                                     if isinstance(t, tf.Tensor) else t, features)


class PrefetchHook(tf.compat.v1.train.SessionRunHook):
    """What tf.make_prefetch_hook() returns: nothing to start here."""


def make_prefetch_hook(daemon=True, start_now=False):
    """A SessionRunHook that does nothing (see the module docstring)."""
    del daemon, start_now
    return PrefetchHook()
