"""des: exact, synchronous training of CTR models with Distributed Equivalent Substitution."""

import os as _os

# TensorFlow reads these when it loads: keep its start-up banner out of every rank's output.
_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

__version__ = "0.1.0"
