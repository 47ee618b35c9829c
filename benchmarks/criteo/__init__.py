"""The Criteo CTR benchmark: sok-ev against stock TensorFlow on DLRM and DCNv2.

  reader.py      the Criteo text format as a tf.data pipeline
  formats.py     the preprocessed formats as tf.data pipelines: NVTabular
                 Parquet, HugeCTR Raw (one-hot; MLPerf multi-hot, not used by
                 the models), TorchRec/MLPerf NumPy days
  synthetic.py   a seeded generator of that format with a planted model
  embeddings.py  the 26 categorical features: sok-ev Embedding Variables or
                 hash-bucketed tf.Variables (the baseline)
  models.py      the dense towers: DLRM and DCNv2
  training.py    train and eval steps, TF1 Session and TF2 tf.function
  metrics.py     eval AUC and log loss
  report.py      plots, RESULTS.md and runs.jsonl
  run.py         the command line (see its docstring)
"""
