"""The public conformance harnesses a third party runs on their own model or strategy:
``check_model`` (declarations, in-process) and ``python -m des.check`` (N ranks train what 1 rank
trains), which must pass a model defined outside the package and fail a strategy that depends on N."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import tensorflow as tf

from des.models import EmbeddingBlock, Model, check_model, default_models
from des.models.conformance import ModelConformanceError
from des.substitutions import FirstOrderLinear, Substitution
from tests.conftest import REPO, criteo_head, driver_env, run_here

EXAMPLE = REPO / "examples" / "field_weighted_lr.py"


@pytest.mark.parametrize("cls", default_models(), ids=lambda c: c.name)
def test_check_model_passes_the_built_in_models(cls) -> None:
    report = check_model(cls)
    assert report.name == cls.name and report.buffer_width > 0


def test_check_model_passes_the_example_plugin() -> None:
    from des.models import get_model
    from des.plugins import load_plugins

    load_plugins(str(EXAMPLE))
    assert "field_weighted_linear" in str(check_model(get_model("fwlr")))


class _Base(Model):
    name = "broken"

    def blocks(self):
        return [EmbeddingBlock("linear", 1, init="zeros")]

    def substitutions(self):
        return [FirstOrderLinear(self.num_fields)]

    def top(self, params: Mapping[str, tf.Tensor], outputs: Sequence[tf.Tensor]) -> tf.Tensor:
        return outputs[0][:, 0] + params["bias"][0]


class _WideLogits(_Base):
    def top(self, params, outputs):
        return outputs[0] + params["bias"][0]  # [B, 1], not [B]


class _WrongBlock(_Base):
    def blocks(self):
        return [EmbeddingBlock("embedding", 4)]


class _Unregistered(FirstOrderLinear):
    name = "not_in_the_registry"


class _UsesUnregistered(_Base):
    def substitutions(self):
        return [_Unregistered(self.num_fields)]


class _IgnoresOutput(_Base):
    def top(self, params, outputs):
        return tf.zeros_like(outputs[0][:, 0]) + params["bias"][0]


class _BatchNormalised(_Base):
    def top(self, params, outputs):  # depends on the other rows of the batch: not row-wise
        x = outputs[0][:, 0]
        return x - tf.reduce_mean(x) + params["bias"][0]


@pytest.mark.parametrize(("cls", "message"), [
    (_BatchNormalised, "top\\(\\) is not row-wise"),
    (_WideLogits, r"logits of shape \(5, 1\), expected \(5,\)"),
    (_WrongBlock, "reads block 'linear' of dim 1, but the model declares"),
    (_UsesUnregistered, "'not_in_the_registry' .* is not registered"),
    (_IgnoresOutput, "top\\(\\) ignores the output of linear"),
])
def test_check_model_names_what_is_wrong(cls, message: str) -> None:
    with pytest.raises(ModelConformanceError, match=message):
        check_model(cls)


def test_check_model_refuses_what_is_not_a_model() -> None:
    with pytest.raises(ModelConformanceError, match="is not a des.models.Model subclass"):
        check_model(Substitution)


@pytest.fixture(scope="module")
def small_data(tmp_path_factory) -> Path:
    from des.data import prepare

    root = tmp_path_factory.mktemp("check-data")
    return prepare(criteo_head(root / "head.tsv", 1200), root / "store", split=(0.9, 0.1, 0.0), seed=1).path


def des_check(monkeypatch, *args: str) -> subprocess.CompletedProcess:
    """``python -m des.check ARGS`` (its driver in this process; it launches the mpiexec jobs,
    each with a timeout) in the test environment."""
    for key, value in driver_env(2).items():
        monkeypatch.setenv(key, value)
    return run_here(["-m", "des.check", "--timeout", "300", *args], check=False)


@pytest.mark.mpi
def test_a_plugin_model_passes_under_every_synchronous_strategy(small_data: Path, monkeypatch) -> None:
    # --unadmitted init: ps counts an id once per requesting worker and step, so admission with
    # --min-count 2 (a user model's auto) is not des's
    proc = des_check(monkeypatch, "--model", "fwlr", "--plugins", str(EXAMPLE), "--strategy",
                     "des,alltoall,ps,hierarchical",
                     "--ranks", "1,2", "--steps", "4", "--data", str(small_data), "--unadmitted", "init")
    assert proc.returncode == 0 and "des.check: ok" in proc.stdout, proc.stdout + proc.stderr
    for strategy in ("des", "alltoall"):
        assert f"fwlr {strategy} 2 ranks vs {strategy} on 1 rank, float64: max relative difference" in proc.stdout
    # ps's and hierarchical's models depend on N: the harness says what it checks instead, and checks it
    assert "ps's model depends on the number of ranks, so N ranks are not expected to match 1 rank" in proc.stdout
    assert "2 ranks with --group-size 2 train exactly what des trains on 1 rank" in proc.stdout
    for strategy in ("ps", "hierarchical"):
        assert f"fwlr {strategy} 2 ranks vs des on 1 rank, float64: max relative difference" in proc.stdout


@pytest.mark.mpi
def test_a_strategy_whose_initialization_depends_on_n_fails(small_data: Path, monkeypatch) -> None:
    plugin = REPO / "tests" / "plugins" / "n_dependent_strategy.py"
    proc = des_check(monkeypatch, "--model", "wdl", "--plugins", str(plugin), "--strategy", "des_seeded_by_n",
                     "--ranks", "2", "--steps", "3", "--data", str(small_data), "--embedding-dim", "2",
                     "--hidden", "4,2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failures = [line for line in proc.stdout.splitlines() if line.startswith("des.check: FAIL wdl des_seeded_by_n 2 ranks")]
    assert any("first_fc:kernel__value differs" in line for line in failures), proc.stdout
    assert any("predictions differs by" in line for line in failures), proc.stdout
    assert proc.stdout.strip().endswith("des.check: FAILED")


def test_a_failing_job_is_reported_in_one_line(small_data: Path) -> None:
    from des.check import Case, CheckFailed, check

    # an unknown model fails inside the job: the harness names it, no traceback
    with pytest.raises(CheckFailed, match="1 rank\\(s\\): the training job failed: .*unknown model 'nope'"):
        check([Case("nope", "des", str(small_data))], (2,), steps=1, timeout=200)


@pytest.mark.parametrize("cores", [1, 64], ids=["one-after-the-other", "at-once"])
def test_a_job_past_its_time_is_stopped_with_every_rank(small_data: Path, tmp_path: Path, monkeypatch,
                                                       cores: int) -> None:
    import des.check
    from des.check import Case, CheckFailed, check

    # the 1- and 2-rank jobs run one after the other, or at once where every rank has a core; the
    # first past its time fails the check, and no job leaves a process behind (mpiexec and its
    # ranks are one process group, killed whole: at once, the 2-rank job is still running then)
    monkeypatch.setattr(des.check.os, "cpu_count", lambda: cores)
    with pytest.raises(CheckFailed, match="1 rank\\(s\\): the training job did not finish within 2 s"):
        check([Case("deepfm", "des", str(small_data))], (2,), steps=1, timeout=2, workdir=tmp_path)
    for _ in range(10):  # a second: a job left running would still be starting up then
        left = _processes_with(f"--worker {tmp_path}")
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"


def _processes_with(text: str) -> list[str]:
    """The command lines of this machine's processes that contain ``text``."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            line = path.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended meanwhile
            continue
        if text in line:
            found.append(line)
    return found
