"""A CBFFilter sized past what a table allocates counts exactly
(sok_ev.options.BLOOM_FILTER_MAX_BYTES).

DeepRec's modelzoo (`--ev_filter cbf`) asks each table for
CBFFilter(filter_freq=3, max_element_size=2**30,
false_positive_probability=0.01, counter_type=tf.int64): 82 GB of counters,
which DeepRec callocs (untouched pages cost nothing) and sok-ev would
allocate up front. Pinned down:
* such a filter counts exactly instead, with a warning naming the table and
  the size, and the table admits keys exactly as CounterFilter does
  (the reference: the same ids through CounterFilter(3));
* a Bloom filter within the limit keeps its size from the Bloom formula.
"""
import math

import numpy as np
import pytest
import tensorflow as tf

from sok_ev_reference import graph_session

DIM = 2
# Repeats per key: 1 is seen 5 times, 2 four, 3 three, 4 twice, 5 once.
IDS = [1, 2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 1, 2, 1]


def _modelzoo_cbf(sok):
    return sok.CBFFilter(filter_freq=3,
                         max_element_size=2**30,
                         false_positive_probability=0.01,
                         counter_type=tf.int64)


def test_an_oversized_bloom_filter_counts_exactly_and_says_so(sok, monkeypatch):
    warnings = []
    monkeypatch.setattr(tf.compat.v1.logging, "warning", warnings.append)
    option = sok.EmbeddingVariableOption(filter_option=_modelzoo_cbf(sok))
    attributes = sok.options.filter_attributes(option, "get_embedding_variable('C3')")
    assert (attributes["filter_freq"], attributes["filter_counters"],
            attributes["filter_hashes"]) == (3, 0, 0)
    counters = math.ceil(-2**30 * math.log(0.01) / math.log(2)**2)
    assert counters * 8 > sok.options.BLOOM_FILTER_MAX_BYTES
    assert len(warnings) == 1
    assert "get_embedding_variable('C3')" in warnings[0] and str(counters * 8) in warnings[0]


def test_a_bloom_filter_within_the_limit_keeps_its_size(sok, monkeypatch):
    # 2**20 keys at p = 0.01: 10,050,540 one-byte counters (10 MB).
    option = sok.EmbeddingVariableOption(filter_option=sok.CBFFilter(3, 2**20, 0.01, tf.uint8))
    counters = math.ceil(-2**20 * math.log(0.01) / math.log(2)**2)
    assert sok.options.filter_attributes(option, "t")["filter_counters"] == counters
    monkeypatch.setattr(sok.options, "BLOOM_FILTER_MAX_BYTES", counters - 1)
    assert sok.options.filter_attributes(option, "t")["filter_counters"] == 0


def _trained_table(sok, name, filter_option):
    option = sok.EmbeddingVariableOption(filter_option=filter_option)
    with graph_session() as sess:
        ev = sok.get_embedding_variable(name,
                                        embedding_dim=DIM,
                                        initializer=tf.compat.v1.ones_initializer(),
                                        ev_option=option)
        emb = tf.nn.embedding_lookup(ev, tf.constant(IDS, tf.int64))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(emb))
        sess.run(tf.compat.v1.global_variables_initializer())
        reads = [sess.run([emb, train])[0] for _ in range(2)]
        keys, rows, frequencies, _, _, _ = sess.run(ev.export_full())
    table = {int(k): (rows[i, :DIM].tolist(), int(frequencies[i])) for i, k in enumerate(keys)}
    return reads, table


def test_the_modelzoo_cbf_table_admits_keys_as_counter_filter(sok, unique_name):
    reads, table = _trained_table(sok, unique_name(), _modelzoo_cbf(sok))
    expected_reads, expected_table = _trained_table(sok, unique_name(), sok.CounterFilter(3))
    for read, expected in zip(reads, expected_reads):
        np.testing.assert_array_equal(read, expected)
    assert table == expected_table
    assert {1, 2, 3} <= set(table) and 5 not in table  # seen 5, 4, 3 times; 5 once
