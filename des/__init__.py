"""des: exact, synchronous training of CTR models with Distributed Equivalent Substitution."""

from des import _tensorflow_env

# before any des module imports TensorFlow: its log level, oneDNN where it pays, no banner
_tensorflow_env.configure()

__version__ = "0.1.0"
