"""Synthetic Criteo-shaped data with a known ground truth (for scale tests and model checks).

Same 39-field schema as Criteo. Each field draws ids from a bounded Zipf-like law over its
vocabulary (``P(rank r) ~ (r+1)^-a``, sampled by inverting the continuous power law on
[1, V+1)); integer fields draw a raw value ``v = rank`` that goes through the usual integer
transform, categorical fields use ``u = rank``; one-hot values go missing with a per-field rate.
Multi-hot fields (optional) have 0..k ids per row, optionally with float weights.

Labels come from a seeded factorization machine over the keys:
``logit = b + sum_i x_i w(key_i) + 1/2 (|sum_i x_i v(key_i)|^2 - sum_i |x_i v(key_i)|^2)``, where
``w`` and the k-vector ``v`` of a key are computed on the fly from ``splitmix64(seed, key)``
(uniform with the configured standard deviations, ``v`` at 16-bit resolution; no table is
stored) and ``b`` is calibrated on a separate sample so that about ``positive_rate`` of rows
are positive. The true probabilities are stored, and the manifest records the generator
parameters and the oracle AUC on the test split. Data are generated in fixed blocks of ``BLOCK_ROWS`` rows, each from
``np.random.default_rng([seed, stream, block])``, so memory is bounded, any chunking gives the
same rows, and a smaller dataset is a prefix of a larger one with the same parameters.
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import numba
import numpy as np

from .batch import FieldBatch
from .build import atomic_directory
from .errors import DataError
from ..splitmix import mix64, seed_to_uint64, stream_value, unit_float
from .keys import FIELD_NAMES, ID_LIMIT, MISSING_VALUE, NUM_INT_FIELDS, integer_keys, make_key
from des.metrics import logloss as log_loss, roc_auc
from .split import DEFAULT_SPLIT, check_fractions
from .store import MULTI_HOT, ONE_HOT, ColumnStore, FieldSpec, StoreWriter

GENERATOR_NAME = "des.data.synth"
GENERATOR_VERSION = 1
BLOCK_ROWS = 1 << 15
DATA_STREAM, CALIBRATION_STREAM, DENSE_WEIGHTS_STREAM = 0, 1, 2
DEFAULT_MULTI_HOT_FIELDS = ("C6", "C14", "C24")
_SQRT3 = math.sqrt(3.0)
_ORACLE_SALT = np.uint64(0x6F7261636C65)  # "oracle"

# (vocabulary, Zipf exponent, missing rate) per field, loosely after the Kaggle Criteo data:
# integer fields: raw values 0..V-1; categorical fields: the Kaggle distinct counts.
CRITEO_LIKE: tuple[tuple[int, float, float], ...] = (
    (1_000, 1.6, 0.45), (20_000, 1.3, 0.0), (20_000, 1.4, 0.21), (500, 1.3, 0.22),
    (1_000_000, 1.1, 0.03), (50_000, 1.3, 0.22), (10_000, 1.5, 0.04), (2_000, 1.2, 0.0005),
    (10_000, 1.2, 0.04), (10, 1.5, 0.45), (200, 1.6, 0.04), (2_000, 1.8, 0.77), (2_000, 1.3, 0.22),
    (1_460, 1.2, 0.0), (583, 1.1, 0.0), (10_131_227, 1.05, 0.034), (2_202_608, 1.05, 0.034),
    (305, 1.3, 0.0), (24, 1.0, 0.12), (12_517, 1.1, 0.0), (633, 1.3, 0.0), (3, 1.5, 0.0),
    (93_145, 1.1, 0.0), (5_683, 1.1, 0.0), (8_351_593, 1.05, 0.034), (3_194, 1.1, 0.0),
    (27, 1.0, 0.0), (14_992, 1.1, 0.0), (5_461_306, 1.05, 0.034), (10, 0.8, 0.0),
    (5_652, 1.1, 0.0), (2_173, 1.2, 0.44), (4, 0.8, 0.44), (7_046_547, 1.05, 0.034),
    (18, 1.2, 0.76), (15, 0.8, 0.0), (286_181, 1.1, 0.034), (105, 1.2, 0.44), (142_572, 1.1, 0.44),
)


@dataclass(frozen=True)
class SynthField:
    """How one synthetic field is drawn."""

    name: str
    kind: str  # "integer" or "categorical"
    vocab: int  # ids 0..vocab-1 (categorical) or raw values 0..vocab-1 (integer)
    zipf: float  # exponent a of P(rank r) ~ (r+1)^-a
    missing: float  # probability that a one-hot value is missing
    max_hot: int = 0  # 0: one-hot; k > 0: multi-hot with 0..k ids per row
    weighted: bool = False  # multi-hot ids carry weights in [0.5, 1.5)


@dataclass(frozen=True)
class SynthConfig:
    """All parameters of the generator (recorded in the manifest; enough to regenerate)."""

    fields: tuple[SynthField, ...]
    seed: int = 0
    latent_dim: int = 4
    linear_std: float = 0.15
    latent_std: float = 0.14
    positive_rate: float = 0.25
    calibration_rows: int = 1 << 17
    #: dense (numeric) features per row, each N(0, 1), entering the oracle's logit linearly
    dense: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``dense`` only when there are dense features: older manifests stay as they were)."""
        data = asdict(self)
        data["fields"] = [asdict(f) for f in self.fields]
        if not self.dense:
            del data["dense"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SynthConfig:
        """Inverse of ``to_dict`` (e.g. from ``manifest["synthetic"]["config"]``)."""
        fields = tuple(SynthField(**f) for f in data["fields"])
        return cls(**{**data, "fields": fields})


def default_config(
    seed: int = 0,
    multi_hot_fields: Sequence[str] = (),
    max_hot: int = 4,
    weighted: bool = False,
    vocab_scale: float = 1.0,
    zipf_scale: float = 1.0,
    categorical_vocab: int = 0,
    **overrides: Any,
) -> SynthConfig:
    """The Criteo-like configuration; ``vocab_scale`` shrinks (or grows) every vocabulary,
    ``zipf_scale`` multiplies every Zipf exponent (smaller: flatter, more distinct ids; 0: every
    value of a vocabulary equally likely, so a vocabulary far larger than the rows gives ids seen
    about once each); ``categorical_vocab`` > 0 is every categorical field's vocabulary instead."""
    unknown = set(multi_hot_fields) - set(FIELD_NAMES[NUM_INT_FIELDS:])
    if unknown:
        raise DataError(f"multi-hot fields must be categorical fields C1..C26, not {', '.join(sorted(unknown))}")
    if max_hot < 1:
        raise DataError(f"max_hot must be >= 1, not {max_hot}")
    if vocab_scale <= 0:
        raise DataError(f"vocab_scale must be positive, not {vocab_scale}")
    if zipf_scale < 0:
        raise DataError(f"zipf_scale must be >= 0, not {zipf_scale}")
    fields = []
    for index, (name, (vocab, zipf, missing)) in enumerate(zip(FIELD_NAMES, CRITEO_LIKE)):
        multi = name in multi_hot_fields
        if categorical_vocab > 0 and index >= NUM_INT_FIELDS:
            vocab, vocab_scale_of = categorical_vocab, 1.0
        else:
            vocab_scale_of = vocab_scale
        fields.append(
            SynthField(
                name=name,
                kind="integer" if index < NUM_INT_FIELDS else "categorical",
                vocab=max(2, int(round(vocab * vocab_scale_of))),
                zipf=zipf * zipf_scale,
                missing=0.0 if multi else missing,
                max_hot=max_hot if multi else 0,
                weighted=weighted and multi,
            )
        )
    return SynthConfig(fields=tuple(fields), seed=int(seed), **overrides)


@numba.njit(cache=True)
def _zipf_kernel(uniform, vocab, exponent, out):
    top = vocab + 1.0
    power = 1.0 - exponent
    flat = abs(power) < 1e-9
    log_top = math.log(top)
    scale = 0.0 if flat else top**power - 1.0
    inverse_power = 0.0 if flat else 1.0 / power
    for i in range(uniform.shape[0]):
        if flat:
            x = math.exp(uniform[i] * log_top)
        else:
            x = (1.0 + scale * uniform[i]) ** inverse_power
        rank = int(x) - 1
        out[i] = min(max(rank, 0), vocab - 1)


def zipf_ranks(uniform: np.ndarray, vocab: int, exponent: float) -> np.ndarray:
    """Map uniforms in [0, 1) to ranks in [0, vocab) with ``P(r) ~ (r+1)^-exponent`` (approx.).

    Inverts the CDF of the continuous power law on [1, vocab+1) and takes ``floor(x) - 1``.
    """
    out = np.empty(uniform.shape[0], dtype=np.int64)
    _zipf_kernel(np.ascontiguousarray(uniform, dtype=np.float64), int(vocab), float(exponent), out)
    return out


@numba.njit(cache=True, inline="always")
def _centered(bits: int, scale: float) -> float:
    """A 16-bit uniform integer as a value of mean 0 and standard deviation ``scale``."""
    return scale * _SQRT3 * ((bits + 0.5) / 32768.0 - 1.0)


@numba.njit(cache=True)
def _accumulate_fm(offsets, keys, weights, has_weights, salt, linear_std, latent_std, linear, latent_sum, square_sum):
    """Add one field's FM contributions (linear term, sum of x*v, sum of |x*v|^2) per row.

    A key's parameters are SplitMix64 outputs: ``base = stream(salt)[key]`` gives ``w`` (53-bit
    uniform), and ``stream(base)[0], [1], ..`` give ``v``, four 16-bit uniforms per output.
    """
    k = latent_sum.shape[1]
    for row in range(offsets.shape[0] - 1):
        for j in range(offsets[row], offsets[row + 1]):
            x = weights[j] if has_weights else 1.0
            base = stream_value(salt, np.uint64(keys[j]))
            linear[row] += x * linear_std * _SQRT3 * (2.0 * unit_float(base) - 1.0)
            bits = np.uint64(0)
            for d in range(k):
                if d % 4 == 0:
                    bits = stream_value(base, np.uint64(d // 4))
                v = x * _centered(np.int64(bits & np.uint64(0xFFFF)), latent_std)
                bits >>= np.uint64(16)
                latent_sum[row, d] += v
                square_sum[row] += v * v


def calibrated_bias(logits: np.ndarray, positive_rate: float) -> float:
    """The bias b with mean sigmoid(logits + b) = positive_rate (bisection on [-50, 50])."""
    low, high = -50.0, 50.0
    for _ in range(100):
        middle = 0.5 * (low + high)
        if np.mean(1.0 / (1.0 + np.exp(-(logits + middle)))) < positive_rate:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


@dataclass
class SynthBlock:
    """One block of generated rows: raw values (for TSV), keyed columns, truth and labels."""

    columns: list[np.ndarray | FieldBatch]
    raw_values: list[np.ndarray]  # one-hot fields: rank / raw integer value (multi-hot: ids)
    raw_missing: list[np.ndarray | None]
    probabilities: np.ndarray  # float32
    labels: np.ndarray  # uint8
    dense: np.ndarray | None = None  # float32 [rows, dense]


class SyntheticGenerator:
    """Draws blocks of synthetic rows for a configuration (bias calibrated on construction)."""

    def __init__(self, config: SynthConfig) -> None:
        for spec in config.fields:
            if not 1 <= spec.vocab <= ID_LIMIT:
                raise DataError(f"field {spec.name}: vocabulary {spec.vocab} outside 1..2^32")
        self.config = config
        self._salt = np.uint64(mix64(seed_to_uint64(config.seed) ^ _ORACLE_SALT))
        self.bias = self._calibrate()

    def field_specs(self) -> list[FieldSpec]:
        """Store schema of the generated fields."""
        return [
            FieldSpec(f.name, f.kind, MULTI_HOT if f.max_hot else ONE_HOT, f.weighted) for f in self.config.fields
        ]

    def dense_names(self) -> list[str]:
        """Names of the generated dense features (``D1``, ``D2``, ...)."""
        return [f"D{d + 1}" for d in range(self.config.dense)]

    def _draw_dense(self, rng: np.random.Generator, rows: int) -> np.ndarray | None:
        """The dense features of ``rows`` rows (after every field's draws: data without dense
        features is drawn as before)."""
        if not self.config.dense:
            return None
        return rng.standard_normal((rows, self.config.dense)).astype(np.float32)

    def _dense_logits(self, dense: np.ndarray | None) -> np.ndarray | float:
        """The dense features' part of the oracle's logit: ``Σ_d c_d x_d``, ``c_d`` uniform with the
        linear terms' standard deviation, from a generator of its own keyed by the seed."""
        if dense is None:
            return 0.0
        rng = np.random.default_rng([self.config.seed % (1 << 63), DENSE_WEIGHTS_STREAM])
        c = self.config.linear_std * _SQRT3 * rng.uniform(-1.0, 1.0, dense.shape[1])
        return dense.astype(np.float64) @ c

    def _draw(self, rng: np.random.Generator, rows: int) -> tuple[list, list, list]:
        columns: list[np.ndarray | FieldBatch] = []
        raw_values: list[np.ndarray] = []
        raw_missing: list[np.ndarray | None] = []
        for index, spec in enumerate(self.config.fields):
            if spec.max_hot:
                counts = rng.integers(0, spec.max_hot + 1, rows)
                offsets = np.zeros(rows + 1, dtype=np.int64)
                np.cumsum(counts, out=offsets[1:])
                ids = zipf_ranks(rng.random(int(offsets[-1])), spec.vocab, spec.zipf)
                weights = rng.uniform(0.5, 1.5, ids.shape[0]).astype(np.float32) if spec.weighted else None
                columns.append(FieldBatch(offsets, make_key(np.int64(index), ids), weights))
                raw_values.append(ids)
                raw_missing.append(None)
                continue
            values = zipf_ranks(rng.random(rows), spec.vocab, spec.zipf)
            missing = rng.random(rows) < spec.missing if spec.missing > 0 else np.zeros(rows, dtype=bool)
            if spec.kind == "integer":
                keys = integer_keys(index, values, missing)
            else:
                keys = make_key(np.int64(index), np.where(missing, MISSING_VALUE, values))
            columns.append(keys)
            raw_values.append(values)
            raw_missing.append(missing)
        return columns, raw_values, raw_missing

    def _raw_logits(self, columns: list[np.ndarray | FieldBatch], rows: int) -> np.ndarray:
        """FM logit of each row without the calibrated bias."""
        config = self.config
        linear = np.zeros(rows)
        latent_sum = np.zeros((rows, config.latent_dim))
        square_sum = np.zeros(rows)
        one_hot_offsets = np.arange(rows + 1, dtype=np.int64)
        no_weights = np.zeros(0, dtype=np.float32)
        for column in columns:
            if isinstance(column, FieldBatch):
                offsets, keys, weights = column.offsets, column.keys, column.weights
            else:
                offsets, keys, weights = one_hot_offsets, column, None
            _accumulate_fm(
                offsets, keys, no_weights if weights is None else weights, weights is not None, self._salt,
                config.linear_std, config.latent_std, linear, latent_sum, square_sum,
            )
        return linear + 0.5 * ((latent_sum**2).sum(axis=1) - square_sum)

    def _calibrate(self) -> float:
        """Bias b with mean sigmoid(logit + b) = positive_rate on the calibration sample."""
        config = self.config
        if not 0.0 < config.positive_rate < 1.0:
            raise DataError(f"positive_rate must be in (0, 1), not {config.positive_rate}")
        parts = []
        for block in range(max(1, math.ceil(config.calibration_rows / BLOCK_ROWS))):
            rng = self._rng(CALIBRATION_STREAM, block)
            columns = self._draw(rng, BLOCK_ROWS)[0]
            parts.append(self._raw_logits(columns, BLOCK_ROWS) + self._dense_logits(self._draw_dense(rng, BLOCK_ROWS)))
        return calibrated_bias(np.concatenate(parts), config.positive_rate)

    def _rng(self, stream: int, block: int) -> np.random.Generator:
        return np.random.default_rng([self.config.seed % (1 << 63), stream, block])

    def block(self, index: int, rows: int = BLOCK_ROWS) -> SynthBlock:
        """Block ``index`` of the data (its first ``rows`` rows; the draws are always full-size)."""
        rng = self._rng(DATA_STREAM, index)
        columns, raw_values, raw_missing = self._draw(rng, BLOCK_ROWS)
        dense = self._draw_dense(rng, BLOCK_ROWS)
        logits = self._raw_logits(columns, BLOCK_ROWS) + self._dense_logits(dense) + self.bias
        probabilities = (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        labels = (rng.random(BLOCK_ROWS) < probabilities).astype(np.uint8)
        if rows < BLOCK_ROWS:
            columns = [c.take(0, rows) if isinstance(c, FieldBatch) else c[:rows] for c in columns]
            raw_values = [
                v[: c.offsets[-1]] if isinstance(c, FieldBatch) else v[:rows] for v, c in zip(raw_values, columns)
            ]
            raw_missing = [None if m is None else m[:rows] for m in raw_missing]
        return SynthBlock(columns, raw_values, raw_missing, probabilities[:rows], labels[:rows],
                          None if dense is None else dense[:rows])

    def blocks(self, rows: int) -> Iterator[SynthBlock]:
        """All blocks of a dataset of ``rows`` rows, in order."""
        for index in range(math.ceil(rows / BLOCK_ROWS)):
            yield self.block(index, min(BLOCK_ROWS, rows - index * BLOCK_ROWS))


def synthesize_store(
    output: str | os.PathLike,
    rows: int,
    config: SynthConfig,
    split: Sequence[float] = DEFAULT_SPLIT,
    overwrite: bool = False,
) -> ColumnStore:
    """Generate ``rows`` rows into a column store (with true probabilities and oracle metrics)."""
    if rows < 1:
        raise DataError(f"rows must be positive, not {rows}")
    fractions = check_fractions(split)
    generator = SyntheticGenerator(config)
    test_labels, test_probabilities = [], []
    with atomic_directory(output, "replace" if overwrite else "error") as directory:
        extra_arrays = {"probabilities": np.float32}
        with StoreWriter(directory, generator.field_specs(), fractions, config.seed, extra_arrays,
                         dense_names=generator.dense_names()) as writer:
            for block in generator.blocks(rows):
                codes = writer.append(block.labels, block.columns, {"probabilities": block.probabilities},
                                      dense=block.dense)
                test_labels.append(block.labels[codes == 2])
                test_probabilities.append(block.probabilities[codes == 2])
            labels, probabilities = np.concatenate(test_labels), np.concatenate(test_probabilities)
            has_test = labels.shape[0] > 0
            both_classes = 0 < int(labels.sum()) < labels.shape[0]
            writer.finish(
                sources=[],
                synthetic={
                    "generator": GENERATOR_NAME,
                    "version": GENERATOR_VERSION,
                    "block_rows": BLOCK_ROWS,
                    "rows": rows,
                    "config": config.to_dict(),
                    "calibrated_bias": generator.bias,
                    "oracle": {
                        "split": "test",
                        "rows": int(labels.shape[0]),
                        "auc": roc_auc(labels, probabilities) if both_classes else None,
                        "logloss": log_loss(labels, probabilities) if has_test else None,
                    },
                },
            )
    return ColumnStore.open(output)


@numba.njit(cache=True)
def _write_decimal(out, pos, value):
    if value < 0:
        out[pos] = 45
        pos += 1
        value = -value
    digits = 1
    probe = value
    while probe >= 10:
        probe //= 10
        digits += 1
    for i in range(digits - 1, -1, -1):
        out[pos + i] = 48 + value % 10
        value //= 10
    return pos + digits


@numba.njit(cache=True)
def _format_tsv(labels, values, missing, num_int_fields, out):
    """Write rows as Criteo TSV bytes into ``out``; returns the number of bytes written."""
    pos = 0
    hex_digits = b"0123456789abcdef"
    for row in range(labels.shape[0]):
        out[pos] = 48 + labels[row]
        pos += 1
        for field in range(values.shape[0]):
            out[pos] = 9
            pos += 1
            if missing[field, row]:
                continue
            value = values[field, row]
            if field < num_int_fields:
                pos = _write_decimal(out, pos, value)
            else:
                for shift in range(28, -4, -4):
                    out[pos] = hex_digits[(value >> shift) & 15]
                    pos += 1
        out[pos] = 10
        pos += 1
    return pos


def _maybe_gzip(raw: IO[bytes], compress: bool) -> AbstractContextManager[IO[bytes]]:
    """``raw`` itself, or a gzip writer on it with a fixed header (no name, no time)."""
    if not compress:
        return nullcontext(raw)
    return gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0)


def synthesize_tsv(
    output: str | os.PathLike, rows: int, config: SynthConfig, overwrite: bool = False
) -> dict[str, Any]:
    """Write ``rows`` rows as a raw Criteo TSV file (gzip if ``output`` ends in .gz), atomically."""
    if rows < 1:
        raise DataError(f"rows must be positive, not {rows}")
    multi_hot = [f.name for f in config.fields if f.max_hot]
    if multi_hot:
        raise DataError(f"the TSV format cannot hold multi-hot fields ({', '.join(multi_hot)})")
    target = Path(output)
    if target.exists() and not overwrite:
        raise DataError(f"{target}: output already exists (remove it or pass --force)")
    generator = SyntheticGenerator(config)
    temporary = target.parent / f".{target.name}.tmp-{os.getpid()}"
    target.parent.mkdir(parents=True, exist_ok=True)
    buffer = np.empty(BLOCK_ROWS * (2 + NUM_INT_FIELDS * 21 + (len(config.fields) - NUM_INT_FIELDS) * 9), np.uint8)
    positives = 0
    try:
        with open(temporary, "wb") as raw, _maybe_gzip(raw, target.name.endswith(".gz")) as handle:
            for block in generator.blocks(rows):
                values = np.stack(block.raw_values)
                missing = np.stack(block.raw_missing)
                size = _format_tsv(block.labels, values, missing, NUM_INT_FIELDS, buffer)
                handle.write(memoryview(buffer[:size]))
                positives += int(block.labels.sum())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return {"rows": rows, "positive_rate": positives / rows, "calibrated_bias": generator.bias}

