"""Configuration: defaults < TOML file < flags, and one clear line for every wrong value."""

from __future__ import annotations

from pathlib import Path

import pytest

from des.config import TrainConfig, build_parser, load_config
from des.errors import ConfigError, UsageError


def test_flags_override_the_toml_file(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('model = "wdl"\nbatch_size = 2048\nhidden = [64, 32]\nl2-dense = 1e-5\nprogress = false\n')
    config = load_config(["--config", str(toml), "--batch-size", "512"])
    assert config.model == "wdl" and config.batch_size == 512 and config.hidden_units() == [64, 32]
    assert config.l2_dense == 1e-5 and config.progress is False
    assert config.epochs == TrainConfig().epochs  # untouched options keep their defaults


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('batch_size = "big"\n', "batch_size = 'big' has the wrong type"),
        ("learning_rate = 0.1\n", "unknown option 'learning_rate'"),
        ("model = \n", "is not valid TOML"),
    ],
)
def test_bad_toml_files(tmp_path: Path, content: str, message: str) -> None:
    toml = tmp_path / "bad.toml"
    toml.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config(["--config", str(toml)])


def test_missing_toml_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(["--config", str(tmp_path / "nope.toml")])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--hidden", "400,x"], "--hidden must be comma-separated integers"),
        (["--epochs", "0", "--max-steps", "0"], "nothing to train"),
        (["--ttl", "-1"], "--ttl must not be negative"),
        (["--split", "a,b"], "--split: split 'a,b' is not three comma-separated numbers"),
        (["--split", "0.5,0.5"], "--split: split needs 3 fractions"),
        (["--split", "0.9,0.2,0.1"], "must be non-negative and sum to 1"),
        (["--strategy", "nope"], "unknown strategy 'nope' \\(choose one of: des, alltoall, ps"),
        (["--dtype", "float16"], r"argument --dtype: invalid choice: 'float16'.*\(see --help\)"),
        (["--batch-size", "many"], "argument --batch-size: invalid int value: 'many'"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_values(flags: list[str], message: str) -> None:
    # UsageError: the same on every rank, so only rank 0 prints it (see des.collectives.failure).
    with pytest.raises(UsageError, match=message):
        load_config(flags)


def test_auto_linear_optimizer_depends_on_the_model() -> None:
    assert load_config(["--model", "lr"]).linear_optimizer_spec() == "adagrad:lr=0.1"
    assert "alpha=0.5" in load_config(["--model", "fm"]).linear_optimizer_spec()
    assert "alpha=0.05" in load_config(["--model", "deepfm"]).linear_optimizer_spec()
    assert load_config(["--model", "fm"]).embedding_optimizer_spec() == "adam:lr=0.001"
    assert load_config(["--model", "deepfm"]).embedding_optimizer_spec() == "adam:lr=0.001,catchup=1"
    assert load_config(["--linear-optimizer", "sgd:lr=0.1"]).linear_optimizer_spec() == "sgd:lr=0.1"


def test_auto_admission_and_l2_depend_on_the_model() -> None:
    """Chosen on validation (scripts/select_defaults.py): the shared out-of-vocabulary row for ids
    seen once (--min-count 2) except for FM, and l2 0.01 on looked-up rows for LR."""
    def resolved(*flags: str) -> tuple:
        c = load_config(list(flags))
        return c.min_count_value(), c.unadmitted_mode(), c.l2_embedding_value()

    assert resolved("--model", "lr") == (2, "shared", 0.01)
    assert resolved("--model", "fm") == (1, "init", 0.0)
    assert resolved("--model", "deepfm") == resolved("--model", "wdl") == (2, "shared", 0.0)
    assert resolved("--model", "fm", "--unadmitted", "shared") == (2, "shared", 0.0)
    assert resolved("--model", "lr", "--unadmitted", "init", "--l2-embedding", "0") == (1, "init", 0.0)
    assert resolved("--min-count", "3", "--unadmitted", "zero") == (3, "zero", 0.0)
    for flags, message in ((["--min-count", "-1"], "--min-count must not be negative"),
                           (["--l2-embedding", "-0.5"], "--l2-embedding must be -1 \\(auto\\) or at least 0")):
        with pytest.raises(UsageError, match=message):
            load_config(flags)


def test_auto_is_what_the_model_class_declares() -> None:
    """``auto`` resolves from the model class's ``defaults``: W&D and DeepFM keep Model's, a user
    model inherits its parent's or declares its own once registered."""
    import dataclasses

    from des.models import LR, MODEL_REGISTRY, DeepFM, Model, ModelDefaults, WideAndDeep, register_model

    assert WideAndDeep.defaults == DeepFM.defaults == Model.defaults == ModelDefaults()

    class SharpLR(LR):
        name = "sharp_lr"
        defaults = dataclasses.replace(LR.defaults, l2_embedding=0.5, unadmitted="init")

    register_model(SharpLR)
    try:
        c = TrainConfig(model="sharp_lr")
        assert (c.linear_optimizer_spec(), c.min_count_value(), c.unadmitted_mode(), c.l2_embedding_value(),
                c.early_stop_patience(100)) == ("adagrad:lr=0.1", 1, "init", 0.5, 0)
    finally:
        MODEL_REGISTRY.unregister("sharp_lr")
    with pytest.raises(ValueError, match="unadmitted"):
        ModelDefaults(unadmitted="never")


def test_auto_early_stop_depends_on_the_model() -> None:
    """LR trains all --epochs (chosen by 3-fold cross-validation on the training rows,
    scripts/select_defaults.py --cv 3); the other models stop 6 validations after their best (chosen
    on validation over three data sets, scripts/select_patience.py)."""
    assert load_config(["--model", "lr"]).early_stop_patience(100) == 0
    assert load_config(["--model", "deepfm"]).early_stop_patience(100) == load_config([]).early_stop_patience(100) == 6
    assert load_config(["--model", "fm"]).early_stop_patience(0) == 0  # no validation rows
    assert load_config(["--model", "wdl", "--max-steps", "5"]).early_stop_patience(100) == 0
    assert load_config(["--model", "lr", "--early-stop", "3"]).early_stop_patience(100) == 3


def test_help_documents_every_option() -> None:
    text = build_parser().format_help()
    for name in TrainConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in text


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--strategy", "ps", "--checkpoint-every", "5"], "--checkpoint-every is not supported with --strategy ps"),
        (["--strategy", "ps", "--resume", "x"], "--resume is not supported with --strategy ps"),
        (["--strategy", "ps", "--eval-every", "5"], "--eval-every is not supported with --strategy ps"),
    ],
)
def test_a_strategy_refuses_what_it_cannot_do(flags: list[str], message: str) -> None:
    """Checked after --plugins are loaded (a user strategy declares what it supports), still before
    any communication: a UsageError, one line from rank 0."""
    from des.building import strategy_class

    with pytest.raises(UsageError, match=message):
        strategy_class(load_config(flags))


def test_the_numba_warm_up_runs_every_kind_of_table_rows(tmp_path: Path) -> None:
    """tests/warm_numba.py (a cold cache's kernels compiled beside the suite): valid runs, one per
    row dtype and index layout, each a kernel signature of its own."""
    from tests.warm_numba import RUNS, train_args

    configs = [load_config(train_args(tmp_path / "store", tmp_path / "run", flags)) for flags in RUNS]
    kinds = {(c.dtype if c.table_dtype == "auto" else c.table_dtype, c.table_layout) for c in configs}
    assert kinds == {(d, layout) for d in ("float32", "float64", "bfloat16") for layout in ("counters", "compact")}
