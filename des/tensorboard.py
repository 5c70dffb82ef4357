"""TensorBoard scalars of a run, written by rank 0 to ``<run folder>/tensorboard`` next to
``metrics.jsonl`` (with ``tf.summary`` ops: writing them does not need the tensorboard package).

    .venv/bin/pip install tensorboard && .venv/bin/tensorboard --logdir runs/   # to look at them

Tags: ``train/loss``, ``train/samples_per_second``, ``validation/auc``, ``validation/logloss``,
``test/auc``, ``test/logloss``, a stream's ``progressive/auc`` and ``progressive/logloss``,
``bytes_per_step/<site>`` and ``learning_rate/<group>`` (the configured rate of each optimizer
group: the rates are constant today).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# metrics.jsonl / summary keys -> TensorBoard tags
TAGS = {
    "train_loss": "train/loss",
    "samples_per_second": "train/samples_per_second",
    "auc": "validation/auc",
    "logloss": "validation/logloss",
    "test_auc": "test/auc",
    "test_logloss": "test/logloss",
    "progressive_auc": "progressive/auc",
    "progressive_logloss": "progressive/logloss",
    "progressive_auc_mean": "progressive/auc_mean",
}


class ScalarWriter:
    """``tf.summary`` scalars under ``<run folder>/tensorboard``; inactive on ranks other than 0.
    The writer is opened at the first write: the run folder does not exist before set-up ends."""

    def __init__(self, run_folder: Path, active: bool, constants: Mapping[str, float] | None = None) -> None:
        self.folder = Path(run_folder) / "tensorboard"
        self.active = active
        self.constants = dict(constants or {})  # written with every record (e.g. learning rates)
        self._writer: Any = None

    def scalars(self, step: int, values: Mapping[str, Any]) -> None:
        """Write every finite number of ``values`` at ``step`` (keys renamed by ``TAGS``)."""
        if not self.active:
            return
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(str(self.folder))
        with self._writer.as_default():
            for key, value in {**values, **self.constants}.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    # What tf.summary.scalar writes, without needing the tensorboard package.
                    tf.summary.write(TAGS.get(key, key), tf.constant(float(value), tf.float32), step=int(step),
                                     metadata=_scalar_metadata())
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _scalar_metadata() -> Any:
    """The metadata that marks a summary as a TensorBoard scalar (``tensorboard.plugins.scalar``)."""
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
                                       data_class=summary_pb2.DATA_CLASS_SCALAR)


def learning_rates(optimizers: Any) -> dict[str, float]:
    """``learning_rate/<group>`` of an ``Optimizers``: the sparse blocks' and the dense rate (FTRL's
    rate is its ``alpha``)."""
    groups = {**{f"sparse_{name}": opt for name, opt in optimizers.sparse.items()}, "dense": optimizers.dense}
    out = {}
    for group, opt in groups.items():
        rate = getattr(opt, "lr", getattr(opt, "alpha", None))
        if rate is not None:
            out[f"learning_rate/{group}"] = float(rate)
    return out


def summary_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """The end-of-run scalars of a ``summary.json``: test AUC / logloss and bytes per step per site."""
    out = {k: summary[k] for k in ("test_auc", "test_logloss", "samples_per_second", "progressive_auc_mean")
           if summary.get(k) is not None}
    for site, value in (summary.get("bytes_per_step_by_site") or {}).items():
        out[f"bytes_per_step/{site}"] = value
    if "bytes_per_step" in summary:
        out["bytes_per_step/total"] = summary["bytes_per_step"]
    return out


def read_scalars(run_folder: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``<run folder>/tensorboard``: tag -> [(step, value), ...] in write order."""
    import tensorflow as tf

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((Path(run_folder) / "tensorboard").glob("events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") else value.simple_value
                out.setdefault(value.tag, []).append((int(event.step), number))
    return out
