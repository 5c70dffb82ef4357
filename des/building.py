"""A job's parts built from its configuration: the strategy class (its options checked), the
model, the optimizers, this rank's strategy with its tables, and the data every rank opens.

``des.train`` (through :mod:`des.startup`), ``des.evaluate``, ``des.export`` and ``des.check``
build with these; strategies and models never import this module.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from des.collectives import Communicator
from des.config import TrainConfig
from des.errors import ConfigError, UsageError


def build_model(config: TrainConfig, num_fields: int, num_dense: int = 0):
    """The model named by ``--model`` with the hyper-parameters its constructor accepts and its own
    ``--model-options``, for data of ``num_fields`` fields and ``num_dense`` dense features."""
    from des.models import get_model

    cls = get_model(config.model)
    candidates = {
        "num_fields": num_fields, "embedding_dim": config.embedding_dim, "hidden": tuple(config.hidden_units()),
        "activation": config.activation, "init_scale": config.init_scale, "l2_embedding": config.l2_embedding_value(),
        "l2_dense": config.l2_dense, "shared_tables": config.shared_tables,
    }
    accepted = inspect.signature(cls.__init__).parameters
    if num_dense:
        candidates["num_dense"] = num_dense
    arguments = {k: v for k, v in candidates.items() if k in accepted}
    arguments.update(parse_model_options(config.model, cls, config.model_options, reserved=[*candidates, "num_dense"]))
    try:
        model = cls(**arguments)
    except ValueError as exc:
        raise ConfigError(f"--model {config.model}: {exc}") from None
    if num_dense and not any(sub.reads_dense for sub in model.substitutions()):
        raise ConfigError(f"--model {config.model} takes no dense features, and the data has {num_dense} "
                          "(declare them as bucketized numbers in the schema, or give the model an operator "
                          "that reads them)")
    return model


def model_options(cls: type) -> dict[str, Any]:
    """The options ``--model-options`` may set for model class ``cls``: its constructor's keyword
    arguments that no other flag sets, with their defaults."""
    flags = {f.name for f in dataclasses.fields(TrainConfig)} | {"num_fields", "num_dense"}
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and name not in flags and p.default is not inspect.Parameter.empty}


def parse_model_options(model: str, cls: type, text: str, reserved: Sequence[str] = ()) -> dict[str, Any]:
    """``--model-options`` (``name=value;name=value``) as constructor arguments, each value of its
    default's type (a tuple: comma-separated integers); a one-line :class:`ConfigError` otherwise."""
    known = model_options(cls)
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        name, sep, value = (x.strip() for x in item.partition("="))
        if name in reserved:
            raise ConfigError(f"--model-options {name}: set it with --{name.replace('_', '-')}")
        if not sep or name not in known:
            listed = ", ".join(f"{k}={_option_text(v)}" for k, v in known.items()) or "none"
            raise ConfigError(f"--model-options {item!r}: {model} takes name=value pairs of {listed}")
        out[name] = _option_value(model, name, value, known[name])
    return out


def _option_text(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def _option_value(model: str, name: str, text: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("true", "1")
        if isinstance(default, (tuple, list)):
            return tuple(int(x) for x in text.split(",") if x.strip())
        return type(default)(text) if default is not None else text
    except ValueError:
        raise ConfigError(f"--model-options {name}={text}: {model} expects a value like {_option_text(default)!r}"
                          ) from None


def build_optimizers(config: TrainConfig):
    from des.hashtable import optimizer_from_spec
    from des.options import Optimizers

    def parse(flag: str, spec: str):
        try:
            return optimizer_from_spec(spec)
        except ValueError as exc:
            raise ConfigError(f"--{flag} {spec!r}: {exc}") from None

    # a sparse rate schedule: FTRL stores its weights (computed when read, they would take the
    # rate of the step that reads them, not the one that last updated them)
    scheduled = not config.schedules()["sparse"].constant

    def sparse(flag: str, spec: str):
        optimizer = parse(flag, spec)
        return optimizer.stored_values(True) if scheduled else optimizer

    return Optimizers(
        sparse={"linear": sparse("linear-optimizer", config.linear_optimizer_spec()),
                "embedding": sparse("embedding-optimizer", config.embedding_optimizer_spec())},
        dense=parse("dense-optimizer", config.dense_optimizer),
    )


def strategy_class(config: TrainConfig):
    """``--strategy``'s class (after ``--plugins`` are imported), its options checked. Every rank
    fails here alike, before any communication: a :class:`UsageError` (one line from rank 0)."""
    from des.plugins import load_plugins
    from des.strategies import get_strategy

    try:
        load_plugins(config.plugins)
        cls = get_strategy(config.strategy)
        cls.check_options(config)
    except UsageError:
        raise
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return cls


def build_strategy(config: TrainConfig, comm: Communicator, num_fields: int, distinct: list[int], *,
                   cls: Any = None, strategy: str | None = None, placement: list[list[int]] | None = None,
                   loads_tables: bool = False, num_dense: int = 0, model: Any = None, admitted: Sequence[int] = ()):
    """The strategy object of this rank, with its model (``model``, or built from ``config``),
    optimizers, placement and tables (``--table-capacity 0``: sized from ``distinct``, unless
    ``loads_tables``: a checkpoint's tables replace them, and two full-size sets would be held at
    once; rows for the ``admitted`` keys, where counted: :func:`table_options`)."""
    from des.strategies import StrategyContext, get_strategy

    cls = cls or get_strategy(strategy or config.strategy)
    if placement is None:
        placement = cls.place(num_fields, comm.size, distinct, config)
    context = StrategyContext(
        model=model or build_model(config, num_fields, num_dense), comm=comm, optimizers=build_optimizers(config),
        placement=placement, seed=config.seed, dtype=np.dtype(config.dtype),
        tables=table_options(config, () if loads_tables else distinct, admitted),
        options=cls.Options.of(config),
        compute_dtype=None if config.compute_dtype == "auto" else config.compute_dtype)
    return cls(context)


def table_options(config: TrainConfig, distinct: Sequence[int], admitted: Sequence[int] = ()):
    """How the tables start (``des.options.TableOptions``): sized from ``distinct`` (by field; empty:
    not from the data; rows for the ``admitted`` keys of each field where given,
    ``des.data.counting.admitted_keys``), admission, and how rows are stored."""
    from des.options import TableOptions
    from des.placement import shared_tables

    shared = shared_tables(config.shared_tables)
    return TableOptions(config.table_capacity, config.min_count_value(), config.unadmitted_mode(), tuple(distinct),
                        config.dtype if config.table_dtype == "auto" else config.table_dtype,
                        tuple(sorted(shared.items())), config.needs_counters(), tuple(admitted))


def layout_table(config: TrainConfig, num_fields: int, num_dense: int = 0):
    """An empty table of the model's row layout for ``config`` (every field's table has the same: its
    optimizers, dims and table dtype), which sizes them all (``footprint.estimated_bytes``)."""
    from des.hashtable import BlockSpec, EmbeddingTable, Initializer

    model, optimizers, tables = build_model(config, num_fields, num_dense), build_optimizers(config), table_options(config, ())
    specs = [BlockSpec(b.name, b.dim, optimizers.sparse[b.name], Initializer(b.init, b.scale)) for b in model.blocks()]
    return EmbeddingTable(0, specs, seed=0, dtype=np.dtype(config.dtype), min_count=tables.min_count,
                          unadmitted=tables.unadmitted, table_dtype=tables.table_dtype, counters=tables.counters)


def open_data(config: TrainConfig, comm: Communicator, data: str | None = None, split=None, bad_rows: str | None = None,
              schema: Any = None):
    """Every rank prepares its share of raw files into the cache (once; ``des/data/ranks.py``) and
    opens the same store: the one of ``--data`` (split by ``--split``), or, with ``--train-data``,
    the separate inputs of each split read as one (``des.data.inputs``; ``data`` given: that one,
    as ``des.evaluate`` does).
    Raw files are read with ``schema`` (default ``--schema``: criteo when empty); a prepared
    directory must have been prepared with it (:func:`des.data.schema.check_same_schema`)."""
    from des.data import open_dataset, open_inputs
    from des.data.schema import check_same_schema, load_schema

    separate = config.train_data and data is None
    cache_dir, bad_rows = config.cache_dir or None, bad_rows or config.bad_rows
    wanted = load_schema(schema if schema is not None else config.schema or None)
    if separate:
        store = open_inputs({"train": config.train_data, "validation": config.validation_data,
                             "test": config.test_data}, cache_dir=cache_dir, bad_rows=bad_rows, schema=wanted,
                            comm=comm.comm)
    else:
        store = open_dataset(data or config.data, cache_dir=cache_dir,
                             split=config.split_fractions() if split is None else split, seed=config.split_seed,
                             bad_rows=bad_rows, schema=wanted, comm=comm.comm)
    if schema is not None or config.schema:  # a schema asked for: the prepared data must be of it
        check_same_schema(store.schema, wanted, f"--data {data or config.data or config.train_data}",
                          resolved=schema is not None and not isinstance(schema, str))
    return store


def data_fingerprint(store) -> str:
    """Identifies the data by content (a store's manifest: sources' sha256, split, counts; separate
    inputs: those of the training and validation inputs, in order)."""
    return store.fingerprint
