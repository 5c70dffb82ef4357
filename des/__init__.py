"""des: exact, synchronous training of CTR models with Distributed Equivalent Substitution."""

from des import _tensorflow_env

# before any des module imports TensorFlow: its log level, oneDNN where it pays, no banner
_tensorflow_env.configure()

__version__ = "0.1.0"


def load(path, *, schema: str = "", batch_size: int = 8192):
    """A trained model (a run folder, ``checkpoints/`` or a checkpoint) on this process, for
    DataFrames: ``.predict(df)``, ``.evaluate(df)``, ``.importance(df)`` (``des/api.py``,
    ``docs/python-api.md``)."""
    from des.api import load as load_model

    return load_model(path, schema=schema, batch_size=batch_size)


def __getattr__(name: str):
    """``des.train``, ``des.data``, ``des.evaluate``, ``des.export``: imported on first use."""
    if name in ("train", "data", "evaluate", "export", "api", "importance"):
        import importlib

        return importlib.import_module(f"des.{name}")
    raise AttributeError(f"module 'des' has no attribute {name!r}")
