"""Loads sok-ev's TensorFlow op library (`_sok_ev_ops.so`) once, on first use.

Every other module reaches the native ops through `ops()`, so importing
`sok_ev` never fails on a broken build; the first call that needs an op does,
with a message naming both TensorFlow versions and the fix.
"""

import os

import tensorflow as tf

_LIBRARY_NAME = "_sok_ev_ops.so"
_BUILT_FOR_FILE = "_tf_version.txt"  # written by the wheel build
_library = None


def ops():
    """Returns the loaded op module (its functions are `sok_ev_<op_name>`).

  Raises:
    ImportError: the library is missing or does not match the installed
      TensorFlow. The message says which TensorFlow it was built against.
  """
    global _library
    if _library is None:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(here, _LIBRARY_NAME)
        try:
            _library = tf.load_op_library(path)
        except (tf.errors.NotFoundError, OSError) as error:
            built_for = "unknown"
            version_file = os.path.join(here, _BUILT_FOR_FILE)
            if os.path.exists(version_file):
                with open(version_file) as f:
                    built_for = f.read().strip()
            raise ImportError(f"sok_ev could not load its op library {path}: {error}\n"
                              f"It was built against TensorFlow {built_for}; TensorFlow "
                              f"{tf.__version__} is installed. Rebuild and reinstall with "
                              "`bash request.sh`.") from error
    return _library
