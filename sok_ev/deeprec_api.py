"""DeepRec's names on stock TensorFlow, so DeepRec scripts run unchanged."""

import tensorflow as tf

from sok_ev import embedding_variable
from sok_ev import options

# Name on tf / tf.compat.v1 -> sok_ev object.
_DEEPREC_NAMES = {
    "get_embedding_variable": embedding_variable.get_embedding_variable,
    "EmbeddingVariableOption": options.EmbeddingVariableOption,
    "InitializerOption": options.InitializerOption,
    "GlobalStepEvict": options.GlobalStepEvict,
}


def install_deeprec_api() -> None:
    """Adds DeepRec's `tf.get_embedding_variable`, `tf.EmbeddingVariableOption`,
  `tf.InitializerOption` and `tf.GlobalStepEvict` to `tf` and `tf.compat.v1`.

  Idempotent. Raises RuntimeError if one of these names already exists in
  TensorFlow with another meaning (for example on a DeepRec build), rather
  than shadowing it.
  """
    for module in (tf, tf.compat.v1):
        for name, value in _DEEPREC_NAMES.items():
            existing = getattr(module, name, None)
            if existing is not None and existing is not value:
                raise RuntimeError(f"install_deeprec_api: {module.__name__}.{name} already exists "
                                   f"({existing!r}); sok-ev will not replace it.")
            setattr(module, name, value)
