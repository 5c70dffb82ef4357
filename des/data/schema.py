"""Declared dataset schemas: which columns a raw table has and what each becomes.

``load_schema(name_or_path)`` gives the built-in ``criteo`` (the default: Criteo's 40-column TSV,
read by its own numba reader, ``[format] type = "criteo"``, with key scheme 1) or ``avazu``
schema, or reads a TOML file::

    name = "movielens"                    # optional, defaults to the file stem
    key_scheme = 2                        # optional: 2 (default) | 1 (features.py: field-tagged keys)
    [format]
    type = "csv"                          # "csv" (any delimiter, .gz ok) | "parquet" | "criteo"
    delimiter = ","                       # one character, "\\t" for TSV
    header = true                         # the first line names the columns...
    # names = ["user_id", ...]            # ...or header = false and the names declared here
    quote = '"'                           # quoting character, or false for none
    null_values = [""]                    # values read as missing

    [label]
    column = "rating"
    rule = ">= 4"                         # >=, >, <=, <, ==, != NUMBER, or "in [a, b, ...]";
                                          # without a rule the column must be 0 or 1

    [[columns]]                            # every other column of the file, by name
    name = "user_id"
    kind = "categorical"                  # categorical | multi_valued | sequence | numeric
                                          # | input | ignored
    dtype = "string"                      # categorical: "string" (default), "int" or "hex" (8 hex
                                          # digits, the value is the key: Criteo's)

    [[columns]]
    name = "genres"
    kind = "multi_valued"
    separator = "|"                       # default "|"
    pooling = "mean"                      # "sum" (default) | "mean"
    max_length = 6                        # optional: keep the first 6
    weight_separator = ":"                # optional: elements are "id:weight"

    [[columns]]
    name = "history"
    kind = "sequence"                     # an ordered list, oldest first (a user's past items)
    separator = "|"                       # default "|"
    max_length = 20                       # required: keep the most recent (last) 20; shorter rows
                                          # are padded (and masked) up to it where a model reads items
    dtype = "string"                      # "string" (default) | "int": how an element is keyed
    pooling = "mean"                      # "mean" (default) | "sum" | "none": its items apart, as
                                          # fields history@1 (the most recent) .. history@20 of one
                                          # id or none each, for a model attending over them (din)
    table = "movie_id"                    # optional (categorical, multi_valued, sequence): share
                                          # that column's table (keys, rows, optimizer state)

    [[columns]]
    name = "age"
    kind = "numeric"
    as = "dense"                          # "dense": a number the model sees | "bucketize": a field
    # dtype = "int"                       # optional: requests carry int64 (default "float": float64)
    transform = "log1p"                   # dense: "none" (default) | "log1p" (of max(v, 0))
    standardize = true                    # dense: (x - mean) / std over the training rows
    fill = 0.0                            # dense: the value of a missing number (default 0)
    # buckets = "quantiles"               # bucketize: "quantiles" (count = 10) | "boundaries"
    # count = 10                          #   (boundaries = [...]) | "log_squared" (Criteo's)

    [[columns]]
    name = "timestamp"
    kind = "input"                        # read for derived fields only
    dtype = "int"                         # "int" | "float" | "string"

    [[derived]]                            # categorical fields computed from columns or fields
    name = "hour"
    transform = "hour_of_day"             # hour_of_day | weekday | cross | prefix | a plugin's
    inputs = ["timestamp"]
    time_format = "unix"                  # or a fixed-width format such as "%y%m%d%H"

Every column of a file must be declared (the label, a ``[[columns]]`` entry, or ``kind =
"ignored"`` for a column that is dropped), so nothing is dropped silently; a declared column
missing from the file is an error too. The store's fields are, in order, the sparse columns
(categorical, multi_valued, sequence, numeric bucketized) in declaration order, then the derived fields;
the dense block holds the ``as = "dense"`` columns in declaration order.

A problem with a schema is one :class:`DataError` line naming the schema and the key, e.g.
``schema movielens.toml: columns[3].pooling: "max" is not one of sum, mean``. After preparing, the
resolved schema (quantile boundaries, standardize mean and std of the training rows) is recorded in
the store's manifest (``"schema"``); :meth:`Schema.from_dict` reads it back.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .bars import BARS_SCHEMAS
from .errors import DataError
from .features import KEY_SCHEME_2, TRANSFORMS
from .keys import FIELD_NAMES, KEY_SCHEME, NUM_INT_FIELDS
from .store import MULTI_HOT, ONE_HOT, FieldSpec

KINDS = ("categorical", "multi_valued", "sequence", "numeric", "input", "ignored")
LIST_KINDS = ("multi_valued", "sequence")  # a cell is a delimited list of ids: a multi-hot field
FORMAT_TYPES = ("csv", "parquet", "criteo")
KEY_SCHEMES = (1, 2)
POOLINGS = ("sum", "mean")
SEQUENCE_POOLINGS = (*POOLINGS, "none")  # none: a sequence's items apart, a field each (ColumnSpec.items)
BUCKETS = ("quantiles", "boundaries", "log_squared")
DENSE_TRANSFORMS = ("none", "log1p")
NUMERIC_AS = ("dense", "bucketize")
_RULE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\S+)\s*$")
_IN_RULE = re.compile(r"^\s*in\s*\[(.*)\]\s*$")


@dataclass(frozen=True)
class FormatSpec:
    """How the raw file is laid out."""

    type: str = "csv"
    delimiter: str = ","
    header: bool = True
    names: tuple[str, ...] = ()
    quote: str | None = '"'
    null_values: tuple[str, ...] = ("",)


@dataclass(frozen=True)
class LabelSpec:
    """The label column and, optionally, the rule that makes a value positive."""

    column: str
    rule: str | None = None

    def parsed_rule(self) -> tuple[str, tuple[float, ...]] | None:
        """``(operator, operands)`` of the rule (operator ``in`` takes several), None without one."""
        if self.rule is None:
            return None
        match = _RULE.match(self.rule)
        if match:
            return match.group(1), (float(match.group(2)),)
        match = _IN_RULE.match(self.rule)
        if match:
            return "in", tuple(float(x) for x in match.group(1).split(",") if x.strip())
        raise ValueError(f"{self.rule!r} is not OP NUMBER (OP one of >=, >, <=, <, ==, !=) or \"in [a, b, ...]\"")


@dataclass(frozen=True)
class ColumnSpec:
    """One declared column of the file (not the label)."""

    name: str
    kind: str
    dtype: str = "string"  # categorical: string | int | hex; input: int | float | string; numeric: float | int
    separator: str = "|"
    pooling: str = "sum"
    max_length: int | None = None
    weight_separator: str | None = None
    as_: str = "bucketize"  # numeric: dense | bucketize
    transform: str = "none"
    standardize: bool = False
    fill: float = 0.0
    buckets: str = "quantiles"
    count: int = 10
    boundaries: tuple[float, ...] | None = None  # fixed, or resolved quantiles
    mean: float | None = None  # resolved standardize statistics
    std: float | None = None
    table: str | None = None  # categorical, multi_valued, sequence: the column whose table it shares

    @property
    def value_dtype(self) -> str:
        """The dtype its values are read as: ``string``, ``int`` or ``float``."""
        if self.kind == "numeric":
            return "int" if self.dtype == "int" else "float"
        if self.kind in LIST_KINDS or self.dtype == "hex":
            return "string"
        return self.dtype

    @property
    def key_dtype(self) -> str:
        """How a field's ids are keyed: a categorical's dtype, a sequence's element dtype, a
        multi-valued column's ``string`` (columns sharing a table must key their ids alike)."""
        return "string" if self.kind == "multi_valued" else self.dtype

    @property
    def is_list(self) -> bool:
        """A cell is a delimited list of ids (multi-valued or sequence): a multi-hot field."""
        return self.kind in LIST_KINDS

    @property
    def items(self) -> bool:
        """A sequence read item by item (``pooling = "none"``): :attr:`field_names` has a field per slot."""
        return self.kind == "sequence" and self.pooling == "none"

    @property
    def field_names(self) -> tuple[str, ...]:
        """The store's fields of this sparse column: itself, or an items sequence's slots
        ``name@1`` (the most recent id) .. ``name@max_length``, each of one id or none."""
        if self.items:
            return tuple(f"{self.name}@{t}" for t in range(1, int(self.max_length) + 1))
        return (self.name,)

    @property
    def is_sparse(self) -> bool:
        return self.kind in ("categorical", *LIST_KINDS) or (self.kind == "numeric" and self.as_ == "bucketize")

    @property
    def is_dense(self) -> bool:
        return self.kind == "numeric" and self.as_ == "dense"

    @property
    def weighted(self) -> bool:
        return self.is_list and (self.pooling == "mean" or self.weight_separator is not None)

    @property
    def needs_statistics(self) -> bool:
        """True while its training statistics are still to be computed."""
        if self.kind != "numeric":
            return False
        if self.as_ == "bucketize":
            return self.buckets == "quantiles" and self.boundaries is None
        return self.standardize and (self.mean is None or self.std is None)


@dataclass(frozen=True)
class DerivedSpec:
    """A categorical field computed by a transform from input columns or earlier fields."""

    name: str
    transform: str
    inputs: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Schema:
    """A declared dataset schema (see the module docstring); ``source`` names it in messages."""

    name: str
    format: FormatSpec
    label: LabelSpec
    columns: tuple[ColumnSpec, ...]
    derived: tuple[DerivedSpec, ...] = ()
    source: str = field(default="", compare=False)
    key_scheme: int = 2  # 1: every field's key tagged with its number (features.py)

    def column(self, name: str) -> ColumnSpec:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    @property
    def file_columns(self) -> tuple[str, ...]:
        """Every declared column of the file: the label and each ``[[columns]]`` entry."""
        return (self.label.column, *(c.name for c in self.columns))

    @property
    def read_columns(self) -> tuple[ColumnSpec, ...]:
        """The columns whose values are read (all but the label and the ignored ones)."""
        return tuple(c for c in self.columns if c.kind != "ignored")

    @property
    def sparse_columns(self) -> tuple[ColumnSpec, ...]:
        return tuple(c for c in self.columns if c.is_sparse)

    @property
    def dense_columns(self) -> tuple[ColumnSpec, ...]:
        return tuple(c for c in self.columns if c.is_dense)

    @property
    def multi_valued_names(self) -> frozenset[str]:
        """The multi-hot fields' names (multi-valued and sequence columns)."""
        return frozenset(c.name for c in self.columns if c.is_list)

    @property
    def sequence_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.kind == "sequence")

    def table_owner(self, name: str) -> str:
        """The field whose table field ``name`` uses: the column its ``table`` names, else itself."""
        for column in self.columns:
            if column.name == name:
                return column.table or name
        return name

    @property
    def shared_tables(self) -> dict[str, tuple[str, ...]]:
        """Owner field -> the fields sharing its table (``table = "<owner>"``), in declaration order."""
        out: dict[str, tuple[str, ...]] = {}
        for column in self.columns:
            if column.table is not None:
                out[column.table] = (*out.get(column.table, ()), *column.field_names)
        return out

    @property
    def field_names(self) -> tuple[str, ...]:
        """The store's fields in order: sparse columns, then derived fields."""
        return (*(f for c in self.sparse_columns for f in c.field_names), *(d.name for d in self.derived))

    @property
    def dense_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.dense_columns)

    def field_specs(self) -> list[Any]:
        """The store's :class:`des.data.store.FieldSpec` s (kind: the column's kind, or ``derived``;
        key scheme 1 names a bucketized number's field ``integer``, as ``keys.KEY_SCHEME`` does)."""
        specs = [FieldSpec(name, "integer" if self.key_scheme == 1 and c.kind == "numeric" else c.kind,
                           MULTI_HOT if c.is_list else ONE_HOT, c.weighted)
                 for c in self.sparse_columns for name in c.field_names]
        return specs + [FieldSpec(d.name, "derived", ONE_HOT, False) for d in self.derived]

    def layout(self) -> list[tuple[str, str, str, bool]]:
        """What :meth:`des.data.store.ColumnStore.layout` of a store prepared with it returns."""
        return ([(s.name, s.kind, s.hotness, s.weighted) for s in self.field_specs()]
                + [(name, "dense", "dense", False) for name in self.dense_names])

    @property
    def resolved(self) -> bool:
        """True when every statistic (quantile boundaries, mean/std) is known."""
        return not any(c.needs_statistics for c in self.columns)

    @property
    def statistics_columns(self) -> tuple[ColumnSpec, ...]:
        """The numeric columns whose statistics come from the training rows (resolved or not)."""
        return tuple(c for c in self.columns if c.kind == "numeric" and (
            (c.as_ == "bucketize" and c.buckets == "quantiles") or (c.as_ == "dense" and c.standardize)))

    def with_statistics(self, statistics: Mapping[str, Mapping[str, Any]]) -> Schema:
        """A copy with ``{column: {"boundaries": [...]} or {"mean": m, "std": s}}`` filled in."""
        columns = []
        for column in self.columns:
            values = statistics.get(column.name)
            if values:
                column = replace(column, **{k: (tuple(float(x) for x in v) if k == "boundaries" else float(v))
                                            for k, v in values.items()})
            columns.append(column)
        return replace(self, columns=tuple(columns))

    def statistics(self) -> dict[str, dict[str, Any]]:
        """The training statistics filled in, as :meth:`with_statistics` takes them (JSON-ready)."""
        found: dict[str, dict[str, Any]] = {}
        for column in self.statistics_columns:
            if column.as_ == "dense" and column.mean is not None:
                found[column.name] = {"mean": column.mean, "std": column.std}
            elif column.as_ != "dense" and column.boundaries is not None:
                found[column.name] = {"boundaries": list(column.boundaries)}
        return found

    def without_statistics(self) -> Schema:
        """A copy as declared: the training statistics of quantiles and standardize removed."""
        columns = [replace(c, boundaries=None) if c.kind == "numeric" and c.buckets == "quantiles"
                   and c.as_ == "bucketize" else replace(c, mean=None, std=None) if c.is_dense else c
                   for c in self.columns]
        return replace(self, columns=tuple(columns))

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict[str, Any]:
        """The schema as plain data (TOML's layout; resolved statistics included), JSON-ready."""
        fmt: dict[str, Any] = {"type": self.format.type}
        if self.format.type == "csv":
            fmt.update(delimiter=self.format.delimiter, header=self.format.header,
                       quote=self.format.quote if self.format.quote is not None else False,
                       null_values=list(self.format.null_values))
            if not self.format.header:
                fmt["names"] = list(self.format.names)
        label: dict[str, Any] = {"column": self.label.column}
        if self.label.rule is not None:
            label["rule"] = self.label.rule
        data: dict[str, Any] = {"name": self.name, "format": fmt, "label": label,
                                "columns": [_column_dict(c) for c in self.columns]}
        if self.key_scheme != 2:  # absent at the default: a schema's record (and fingerprint) stays as it was
            data["key_scheme"] = self.key_scheme
        if self.derived:
            data["derived"] = [{"name": d.name, "transform": d.transform, "inputs": list(d.inputs), **d.options}
                               for d in self.derived]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "manifest") -> Schema:
        """Inverse of :meth:`to_dict` (validated like a TOML file; ``source`` names it in errors)."""
        return _parse(data, source, Path(source).stem, allow_statistics=True)

    @property
    def fingerprint(self) -> str:
        """16 hex digits identifying the schema's content (statistics included)."""
        text = json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _column_dict(c: ColumnSpec) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": c.name, "kind": c.kind}
    if c.kind in ("categorical", "input"):
        entry["dtype"] = c.dtype
    elif c.kind == "sequence":
        entry.update(separator=c.separator, max_length=c.max_length, dtype=c.dtype, pooling=c.pooling)
    elif c.kind == "multi_valued":
        entry.update(separator=c.separator, pooling=c.pooling)
        if c.max_length is not None:
            entry["max_length"] = c.max_length
        if c.weight_separator is not None:
            entry["weight_separator"] = c.weight_separator
    if c.table is not None:  # absent when unshared: a schema's record (and fingerprint) stays as it was
        entry["table"] = c.table
    elif c.kind == "numeric":
        entry["as"] = c.as_
        if c.dtype == "int":
            entry["dtype"] = "int"
        if c.as_ == "dense":
            entry.update(transform=c.transform, standardize=c.standardize, fill=c.fill)
            if c.mean is not None:
                entry.update(mean=c.mean, std=c.std)
        else:
            entry["buckets"] = c.buckets
            if c.buckets == "quantiles":
                entry["count"] = c.count
            if c.boundaries is not None:
                entry["boundaries"] = list(c.boundaries)
    return entry


# ---------------------------------------------------------------------------------- validation
class _Where:
    """Raises one-line errors naming the schema and a key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, message: str) -> None:
        raise DataError(f"schema {self.source}: {path}: {message}")

    def table(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            self.fail(path, f"must be a table, not {type(value).__name__}")
        return value

    def keys(self, table: Mapping[str, Any], path: str, allowed: Sequence[str], required: Sequence[str] = ()) -> None:
        for key in table:
            if key not in allowed:
                self.fail(f"{path}.{key}" if path else key,
                          f"unknown key (expected one of {', '.join(allowed)})")
        for key in required:
            if key not in table:
                self.fail(f"{path}.{key}" if path else key, "missing")

    def string(self, table: Mapping[str, Any], key: str, path: str, default: Any = None,
               choices: Sequence[str] | None = None) -> Any:
        value = table.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str):
            self.fail(f"{path}.{key}", f"{value!r} is not a string")
        if choices is not None and value not in choices:
            self.fail(f"{path}.{key}", f"{json.dumps(value)} is not one of {', '.join(choices)}")
        return value

    def boolean(self, table: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            self.fail(f"{path}.{key}", f"{value!r} is not true or false")
        return value

    def number(self, table: Mapping[str, Any], key: str, path: str, default: float | None) -> float | None:
        value = table.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.fail(f"{path}.{key}", f"{value!r} is not a finite number")
        return float(value)

    def integer(self, table: Mapping[str, Any], key: str, path: str, default: int | None, low: int) -> int | None:
        value = table.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            self.fail(f"{path}.{key}", f"{value!r} is not an integer >= {low}")
        return int(value)

    def strings(self, table: Mapping[str, Any], key: str, path: str, default: Sequence[str] = ()) -> tuple[str, ...]:
        value = table.get(key, list(default))
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(f"{path}.{key}", f"{value!r} is not a list of strings")
        return tuple(value)


_COLUMN_KEYS = {
    "categorical": ("dtype", "table"),
    "multi_valued": ("separator", "pooling", "max_length", "weight_separator", "table"),
    "sequence": ("separator", "max_length", "dtype", "pooling", "table"),
    "input": ("dtype",),
    "ignored": (),
}
_DENSE_KEYS = ("as", "dtype", "transform", "standardize", "fill")
_BUCKET_KEYS = ("as", "dtype", "buckets", "count", "boundaries")


def _parse_column(where: _Where, entry: Any, path: str, allow_statistics: bool) -> ColumnSpec:
    entry = where.table(entry, path)
    where.keys(entry, path, tuple(entry), ("name", "kind"))  # each kind's own options are checked below
    name = where.string(entry, "name", path)
    kind = where.string(entry, "kind", path, choices=KINDS)
    if kind == "numeric":
        as_ = where.string(entry, "as", path, "bucketize", NUMERIC_AS)
        allowed = (_DENSE_KEYS + (("mean", "std") if allow_statistics else ())) if as_ == "dense" else _BUCKET_KEYS
    else:
        allowed = _COLUMN_KEYS[kind]
    for key in entry:
        if key not in ("name", "kind", *allowed):
            where.fail(f"{path}.{key}", f"not an option of a {kind}{' ' + as_ if kind == 'numeric' else ''} column "
                       f"(its options: {', '.join(allowed) or 'none'})")
    table = where.string(entry, "table", path)
    if kind == "categorical":
        return ColumnSpec(name, kind, dtype=where.string(entry, "dtype", path, "string", ("string", "int", "hex")),
                          table=table)
    if kind == "sequence":
        separator = where.string(entry, "separator", path, "|")
        if separator == "":
            where.fail(f"{path}.separator", "must not be empty")
        if "max_length" not in entry:
            where.fail(f"{path}.max_length", "missing (a sequence keeps its most recent max_length ids)")
        pooling = where.string(entry, "pooling", path, "mean", SEQUENCE_POOLINGS)
        if pooling == "none" and table is None:
            where.fail(f"{path}.table", "missing (a sequence read item by item attends to the column whose table "
                                        "it shares: its candidate)")
        return ColumnSpec(name, kind, dtype=where.string(entry, "dtype", path, "string", ("string", "int")),
                          separator=separator, pooling=pooling,
                          max_length=where.integer(entry, "max_length", path, None, 1), table=table)
    if kind == "input":
        return ColumnSpec(name, kind, dtype=where.string(entry, "dtype", path, "string", ("int", "float", "string")))
    if kind == "ignored":
        return ColumnSpec(name, kind)
    if kind == "multi_valued":
        separator = where.string(entry, "separator", path, "|")
        weight_separator = where.string(entry, "weight_separator", path)
        for key, value in (("separator", separator), ("weight_separator", weight_separator)):
            if value == "":
                where.fail(f"{path}.{key}", "must not be empty")
        if weight_separator is not None and weight_separator == separator:
            where.fail(f"{path}.weight_separator", "must differ from separator")
        pooling = where.string(entry, "pooling", path, "sum", POOLINGS)
        return ColumnSpec(name, kind, separator=separator, pooling=pooling,
                          max_length=where.integer(entry, "max_length", path, None, 1),
                          weight_separator=weight_separator, table=table)
    dtype = where.string(entry, "dtype", path, "float", ("float", "int"))
    if as_ == "dense":
        mean = where.number(entry, "mean", path, None)
        std = where.number(entry, "std", path, None)
        if (mean is None) != (std is None) or (std is not None and std <= 0):
            where.fail(f"{path}.std", "mean and a positive std go together")
        return ColumnSpec(name, kind, dtype=dtype, as_="dense",
                          transform=where.string(entry, "transform", path, "none", DENSE_TRANSFORMS),
                          standardize=where.boolean(entry, "standardize", path, False),
                          fill=where.number(entry, "fill", path, 0.0), mean=mean, std=std)
    buckets = where.string(entry, "buckets", path, "quantiles", BUCKETS)
    count = where.integer(entry, "count", path, 10, 2)
    if "count" in entry and buckets != "quantiles":
        where.fail(f"{path}.count", f"only for buckets = \"quantiles\", not {json.dumps(buckets)}")
    boundaries = None
    if "boundaries" in entry:
        if buckets == "log_squared" or (buckets == "quantiles" and not allow_statistics):
            where.fail(f"{path}.boundaries", f"only for buckets = \"boundaries\", not {json.dumps(buckets)}")
        values = entry["boundaries"]
        if (not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    and math.isfinite(v) for v in values)
                or (buckets == "boundaries" and not values) or any(b <= a for a, b in zip(values, values[1:]))):
            where.fail(f"{path}.boundaries", f"{values!r} is not a non-empty increasing list of numbers")
        boundaries = tuple(float(v) for v in values)
    elif buckets == "boundaries":
        where.fail(f"{path}.boundaries", "missing (buckets = \"boundaries\" needs them)")
    return ColumnSpec(name, kind, dtype=dtype, as_="bucketize", buckets=buckets, count=count, boundaries=boundaries)


def _parse_format(where: _Where, data: Mapping[str, Any]) -> FormatSpec:
    fmt = where.table(data.get("format", {}), "format")
    where.keys(fmt, "format", ("type", "delimiter", "header", "names", "quote", "null_values"))
    kind = where.string(fmt, "type", "format", "csv", FORMAT_TYPES)
    if kind != "csv":
        for key in fmt:
            if key != "type":
                where.fail(f"format.{key}", f"only for type = \"csv\", not {json.dumps(kind)}")
        return FormatSpec(type=kind)
    delimiter = where.string(fmt, "delimiter", "format", ",")
    if len(delimiter) != 1 or delimiter in "\r\n":
        where.fail("format.delimiter", f"{delimiter!r} is not one character")
    header = where.boolean(fmt, "header", "format", True)
    names = where.strings(fmt, "names", "format")
    if header and names:
        where.fail("format.names", "only with header = false (the header names the columns)")
    if not header and not names:
        where.fail("format.names", "missing (header = false needs the column names)")
    quote = fmt.get("quote", '"')
    if quote is False:
        quote = None
    elif not isinstance(quote, str) or len(quote) != 1 or quote == delimiter:
        where.fail("format.quote", f"{quote!r} is not one character other than the delimiter, or false")
    null_values = where.strings(fmt, "null_values", "format", ("",))
    return FormatSpec("csv", delimiter, header, names, quote, null_values)


def _parse(data: Mapping[str, Any], source: str, default_name: str, allow_statistics: bool = False) -> Schema:
    where = _Where(source)
    where.table(data, "(top level)")
    where.keys(data, "", ("name", "key_scheme", "format", "label", "columns", "derived"), ("label", "columns"))
    name = where.string(data, "name", "name", default_name) if "name" in data else default_name
    fmt = _parse_format(where, data)
    label_table = where.table(data["label"], "label")
    where.keys(label_table, "label", ("column", "rule"), ("column",))
    label = LabelSpec(where.string(label_table, "column", "label"), where.string(label_table, "rule", "label"))
    try:
        label.parsed_rule()
    except ValueError as error:
        where.fail("label.rule", str(error))
    if not isinstance(data["columns"], list) or not data["columns"]:
        where.fail("columns", "must be a non-empty list of [[columns]] tables")
    columns = tuple(_parse_column(where, entry, f"columns[{i}]", allow_statistics)
                    for i, entry in enumerate(data["columns"]))
    seen = {label.column: "label.column"}
    for i, column in enumerate(columns):
        if column.name in seen:
            where.fail(f"columns[{i}].name", f"{json.dumps(column.name)} is declared twice (also {seen[column.name]})")
        seen[column.name] = f"columns[{i}]"
    if fmt.type == "csv" and not fmt.header:
        declared = set(seen)
        for name_ in fmt.names:
            if name_ not in declared:
                where.fail("format.names", f"{json.dumps(name_)} is not declared (declare it with kind = \"ignored\" "
                                           "to drop it)")
        for name_ in declared - set(fmt.names):
            where.fail(f"{seen[name_]}", f"{json.dumps(name_)} is not one of format.names")
    _check_tables(where, columns)
    derived = _parse_derived(where, data.get("derived", []), columns, seen)
    if not any(c.is_sparse for c in columns) and not derived and not any(c.is_dense for c in columns):
        where.fail("columns", "no feature declared (every column is ignored or an input)")
    key_scheme = data.get("key_scheme", 2)
    if key_scheme not in KEY_SCHEMES or isinstance(key_scheme, bool):
        where.fail("key_scheme", f"{key_scheme!r} is not one of {', '.join(map(str, KEY_SCHEMES))}")
    if key_scheme == 1:
        _check_key_scheme_1(where, columns, derived)
    if fmt.type == "criteo":
        _check_criteo_layout(where, label, columns)
    return Schema(name, fmt, label, columns, derived, source, key_scheme)


def _check_tables(where: _Where, columns: Sequence[ColumnSpec]) -> None:
    """``table = "<column>"``: another categorical, multi-valued or sequence column that keys its
    ids alike and shares no table itself (an owner holds the table, every sharer names it)."""
    by_name = {c.name: c for c in columns}
    for i, column in enumerate(columns):
        if column.table is None:
            continue
        owner = by_name.get(column.table)
        path = f"columns[{i}].table"
        if owner is None or owner is column or owner.kind not in ("categorical", *LIST_KINDS):
            where.fail(path, f"{json.dumps(column.table)} is not another categorical, multi_valued or sequence column")
        if owner.items:
            where.fail(path, f"{json.dumps(owner.name)} is read item by item (pooling = \"none\"): share its items' "
                             "table by naming the column it shares")
        if owner.table is not None:
            where.fail(path, f"{json.dumps(owner.name)} shares the table of {json.dumps(owner.table)}: name that one")
        if owner.key_dtype != column.key_dtype:
            where.fail(path, f"{owner.name} keys {owner.key_dtype} ids, {column.name} {column.key_dtype} ids "
                             "(a shared table needs one dtype)")


def _check_key_scheme_1(where: _Where, columns: Sequence[ColumnSpec], derived: Sequence[DerivedSpec]) -> None:
    """Key scheme 1 tags keys of at most 2^32 + 1 values (features.py): hex ids and buckets only."""
    for i, column in enumerate(columns):
        if column.is_sparse and not (column.kind == "numeric" or column.dtype == "hex"):
            where.fail(f"columns[{i}]", "key_scheme 1 takes categorical dtype \"hex\" and bucketized numeric "
                                        f"fields only, not a {column.kind} of dtype {column.value_dtype}")
    if derived:
        where.fail("derived", "key_scheme 1 takes no derived fields")
    for i, column in enumerate(columns):
        if column.table is not None:
            where.fail(f"columns[{i}].table", "key_scheme 1 tags each field's keys: no field shares a table")


def _check_criteo_layout(where: _Where, label: LabelSpec, columns: Sequence[ColumnSpec]) -> None:
    """``type = "criteo"``: Criteo's reader gives its 40 columns, the label, integers I1..I13 and
    hex ids C1..C26, in that order."""
    names = tuple(c.name for c in columns)
    if label.column != "label" or label.rule is not None or names != FIELD_NAMES:
        where.fail("format.type", "\"criteo\" reads the columns label, I1..I13, C1..C26 (no rule), in that order")
    for i, column in enumerate(columns):
        integer = i < NUM_INT_FIELDS
        if column.kind != "ignored" and (column.kind != "numeric" or column.dtype != "int" if integer
                                         else column.kind != "categorical" or column.dtype != "hex"):
            want = "numeric of dtype \"int\"" if integer else "categorical of dtype \"hex\""
            where.fail(f"columns[{i}]", f"{column.name} of a \"criteo\" file is {want} (or ignored)")


def _parse_derived(where: _Where, entries: Any, columns: Sequence[ColumnSpec],
                   seen: dict[str, str]) -> tuple[DerivedSpec, ...]:
    if not isinstance(entries, list):
        where.fail("derived", "must be a list of [[derived]] tables")
    by_name = {c.name: c for c in columns}
    fields = {c.name for c in columns if c.is_sparse and not c.is_list}
    transforms = TRANSFORMS.all()
    out = []
    for i, entry in enumerate(entries):
        path = f"derived[{i}]"
        entry = where.table(entry, path)
        transform_name = where.string(entry, "transform", path)
        if transform_name is None:
            where.fail(f"{path}.transform", "missing")
        if transform_name not in transforms:
            where.fail(f"{path}.transform", f"{json.dumps(transform_name)} is not one of {', '.join(transforms)}")
        transform = transforms[transform_name]
        where.keys(entry, path, ("name", "transform", "inputs", *transform.options), ("name", "inputs"))
        name = where.string(entry, "name", path)
        if name in seen:
            where.fail(f"{path}.name", f"{json.dumps(name)} is declared twice (also {seen[name]})")
        inputs = where.strings(entry, "inputs", path)
        if len(inputs) != transform.inputs:
            where.fail(f"{path}.inputs", f"{transform_name} takes {transform.inputs} input(s), not {len(inputs)}")
        dtypes = []
        for name_ in inputs:
            if name_ in fields or name_ in (d.name for d in out):
                dtypes.append("key")
            elif name_ in by_name and by_name[name_].kind in ("input", "categorical"):
                dtypes.append(by_name[name_].value_dtype)
            elif name_ in by_name and by_name[name_].kind == "numeric" and by_name[name_].is_dense:
                dtypes.append("float")
            else:
                where.fail(f"{path}.inputs", f"{json.dumps(name_)} is not a declared input column, one-hot field "
                                             "or earlier derived field")
        options = {key: entry.get(key, default) for key, default in transform.options.items()}
        problem = transform().check(options, dtypes)
        if problem:
            where.fail(path, problem)
        seen[name] = path
        out.append(DerivedSpec(name, transform_name, inputs, options))
    return tuple(out)


# ---------------------------------------------------------------------------------- built-ins
_AVAZU_CATEGORICAL = ("C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
                      "app_category", "device_id", "device_ip", "device_model", "device_type", "device_conn_type",
                      "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21")
AVAZU: dict[str, Any] = {
    "name": "avazu",
    "format": {"type": "csv", "delimiter": ",", "header": True},
    "label": {"column": "click"},
    "columns": [{"name": "id", "kind": "ignored"}, {"name": "hour", "kind": "input", "dtype": "string"},
                *({"name": name, "kind": "categorical"} for name in _AVAZU_CATEGORICAL)],
    "derived": [{"name": "hour_of_day", "transform": "hour_of_day", "inputs": ["hour"], "time_format": "%y%m%d%H"},
                {"name": "weekday", "transform": "weekday", "inputs": ["hour"], "time_format": "%y%m%d%H"}],
}


def _criteo() -> dict[str, Any]:
    return {"name": "criteo", "key_scheme": 1, "format": {"type": "criteo"}, "label": {"column": "label"},
            "columns": [{"name": n, "kind": "numeric", "dtype": "int", "as": "bucketize", "buckets": "log_squared"}
                        for n in FIELD_NAMES[:NUM_INT_FIELDS]]
            + [{"name": n, "kind": "categorical", "dtype": "hex"} for n in FIELD_NAMES[NUM_INT_FIELDS:]]}


# What stores of the built-in criteo schema record instead of the schema: they were written so
# before schemas existed, and record so still, so that their manifests (and fingerprints) stay.
CRITEO_TRANSFORM = "Criteo raw TSV: integer v -> v if v <= 2 else floor(ln(v)^2); hex -> int; see key_scheme"


def records_schema(schema: Schema) -> bool:
    """Whether what is prepared with ``schema`` records it (``manifest["schema"]``, a checkpoint's
    ``"schema"``): every schema but the built-in criteo, whose record is its absence (read back as
    the built-in by :func:`load_schema` of None)."""
    return schema != load_schema("criteo")


def manifest_sections(schema: Schema) -> dict[str, Any]:
    """What a store prepared with a resolved ``schema`` records of it: its key scheme and the
    schema (the built-in criteo's stores: the ``transform`` line instead, as always)."""
    record = KEY_SCHEME if schema.key_scheme == 1 else dict(KEY_SCHEME_2)
    if schema.key_scheme == 2 and any(c.dtype == "hex" for c in schema.sparse_columns):
        record["hex"] = "key = int(hex8, 16) + 1"
    if not records_schema(schema):
        return {"key_scheme": record, "transform": CRITEO_TRANSFORM}
    return {"key_scheme": record, "schema": schema.to_dict()}


BUILT_IN = ("criteo", "avazu", *BARS_SCHEMAS)


def load_schema(name_or_path: str | Path | Schema | None = None) -> Schema:
    """A built-in schema (``criteo``, also for None; ``avazu``; the BARS x1 datasets', ``bars.py``)
    or a TOML schema file."""
    if isinstance(name_or_path, Schema):
        return name_or_path
    if name_or_path is None or str(name_or_path) == "criteo":
        return _parse(_criteo(), "criteo (built in)", "criteo")
    if str(name_or_path) == "avazu":
        return _parse(AVAZU, "avazu (built in)", "avazu")
    if str(name_or_path) in BARS_SCHEMAS:
        return _parse(BARS_SCHEMAS[str(name_or_path)], f"{name_or_path} (built in)", str(name_or_path))
    path = Path(name_or_path)
    if not path.is_file():
        raise DataError(f"schema {name_or_path}: not a built-in schema ({', '.join(BUILT_IN)}) nor a TOML file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"schema {path.name}: not valid TOML ({error})") from None
    return _parse(data, path.name, path.stem)



def _declared_content(schema: Schema) -> str:
    """What a schema declares, without its name and its training statistics, as canonical JSON."""
    data = schema.without_statistics().to_dict()
    del data["name"]
    return json.dumps(data, sort_keys=True, allow_nan=False)


def describe_schema(schema: Mapping[str, Any] | None) -> str:
    """How messages name a recorded schema (``ColumnStore.schema`` or a checkpoint's; None:
    Criteo's): its name and the fingerprint of its content, statistics included."""
    if schema is None:
        return "'criteo'"
    resolved = Schema.from_dict(schema)
    return f"{resolved.name!r} (fingerprint {resolved.fingerprint})"


def check_same_schema(recorded: Mapping[str, Any] | None, wanted: Schema, what: str, *, resolved: bool = False) -> None:
    """Data prepared with schema ``recorded`` (``ColumnStore.schema``; None: Criteo's) must be of
    ``wanted``: the same declarations (names aside), and with ``resolved`` the same training
    statistics too. A one-line DataError says how they differ."""
    have = load_schema(None) if recorded is None else Schema.from_dict(recorded)
    same = (have.fingerprint == wanted.fingerprint if resolved
            else _declared_content(have) == _declared_content(wanted))
    if not same:
        how = "other training statistics" if resolved and _declared_content(have) == _declared_content(wanted) else \
            f"schema {describe_schema(recorded)}"
        raise DataError(f"{what} was prepared with {how}, not with the schema {wanted.name!r} asked for "
                        "(prepare it again with that --schema, or leave --schema out to use the data's own)")


def trained_schema(recorded: Mapping[str, Any] | None, asked: str | Path | None, what: str) -> Schema:
    """The resolved schema a model was trained with (``recorded``: a checkpoint's, None: Criteo's):
    what its evaluation and serving read raw rows with, training statistics included. ``asked``
    (a ``--schema`` given anyway) must declare the same, else a one-line DataError."""
    schema = load_schema(None) if recorded is None else Schema.from_dict(recorded, source=what)
    if asked:
        wanted = load_schema(asked)
        if _declared_content(wanted) != _declared_content(schema):
            raise DataError(f"--schema {asked}: {what} was trained on data of schema {describe_schema(recorded)}")
    return schema
