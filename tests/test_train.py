"""The main job as a user runs it: ``mpiexec -n N python -m des.train ...`` and ``des.evaluate``.

Run folder contents, checkpoint/resume equivalence (same and changed rank counts), evaluation on
other data with another rank count, and every bad input ending the whole job with one clear line.
One-rank runs go through the same entry points in this process (``run_here``: no second
TensorFlow start-up); every multi-rank run is a real ``mpiexec`` job.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from sklearn.metrics import roc_auc_score

from tests.conftest import (MPIEXEC, NO_KERAS, REPO, assert_states_equal, criteo_head, mpi_env, mpich_shm, run_here,
                            run_job, run_mpi, run_mpi_many)

SMALL = ["--embedding-dim", "4", "--hidden", "16,8", "--batch-size", "256", "--eval-batch-size", "1024",
         "--no-progress", "--table-capacity", "256"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("train")
    criteo_head(root / "small.tsv", 2000)
    return root


def train_args(work: Path, output: str, *flags: str) -> list[str]:
    return ["-m", "des.train", "--data", str(work / "small.tsv"), "--cache-dir", str(work / "cache"),
            "--output", str(work / output), *SMALL, *flags]


def train(work: Path, ranks: int, output: str, *flags: str, check: bool = True, timeout: float = 240):
    return run_job(ranks, train_args(work, output, *flags), check=check, timeout=timeout)


def summary(work: Path, output: str) -> dict:
    return json.loads((work / output / "summary.json").read_text())


def checkpoint_arrays(folder: Path) -> dict[str, np.ndarray]:
    """Every number a checkpoint holds: dense weights and slots, and each table's rows by key."""
    from des.checkpoint import resolve_checkpoint
    from des.hashtable import EmbeddingTable

    folder = resolve_checkpoint(folder)
    out: dict[str, np.ndarray] = {}
    for path in sorted(folder.glob("*.npz")):
        with np.load(path) as arrays:
            out.update({f"{path.name}/{k}": arrays[k] for k in arrays.files})
    for path in sorted(folder.glob("*.table")):
        table = EmbeddingTable.load(path)
        keys = np.sort(table.keys())
        rows = table.lookup(keys, insert=False)
        out[f"{path.name}/keys"] = keys
        for block in table.blocks:
            out[f"{path.name}/{block.name}"] = table.gather(block.name, keys, rows)
    return out


def assert_checkpoints_equal(a: Path, b: Path, rtol: float = 1e-9) -> None:
    assert_states_equal(checkpoint_arrays(a), checkpoint_arrays(b), rtol)


def test_run_folder_and_summary(work: Path) -> None:
    proc = train(work, 1, "lr-run", "--model", "lr", "--max-steps", "8", "--eval-every", "4",
                 "--checkpoint-every", "4", "--dtype", "float64")
    assert "test AUC" in proc.stdout and "Traceback" not in proc.stderr
    s = summary(work, "lr-run")
    for key in ("model", "ranks", "steps", "train_samples", "test_auc", "test_logloss", "samples_per_second",
                "allreduce_bytes_per_step", "peak_rss_bytes_per_rank"):
        assert key in s, key
    assert s["model"] == "lr" and s["ranks"] == 1 and s["steps"] == 8 and s["train_samples"] == 8 * 256
    assert 0.5 < s["test_auc"] < 1.0
    assert s["allreduce_bytes_per_step"] == 0  # one rank sends nothing
    assert set(s["ms_per_phase_by_rank"]) == {k for k, v in s["ms_per_phase"].items() if v}
    assert all(ms == [round(s["ms_per_phase"][k], 3)] for k, ms in s["ms_per_phase_by_rank"].items())
    assert s["planner"] is None and "planner:" not in proc.stdout  # nor does it plan traffic
    # the start-up line names every split's rows, the test rows too (they add up to the data's)
    counts = re.search(r"\((\d+) rows: (\d+) train, (\d+) validation, (\d+) test\)", proc.stdout)
    assert counts and int(counts[1]) == sum(int(counts[i]) for i in (2, 3, 4)) and int(counts[4]) > 0, proc.stdout[:400]
    # The placement report estimates each rank's table memory from the distinct ids of the data.
    estimate_mib = float(re.search(r"rank 0: 39 fields, +\d+ distinct ids, tables ~ *([\d.]+) MiB", proc.stdout)[1])
    assert 0.5 < estimate_mib * 2**20 / s["table_bytes_per_rank"][0] < 2, (estimate_mib, s["table_bytes_per_rank"])
    records = [json.loads(line) for line in (work / "lr-run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8]
    assert all(0 < r["auc"] < 1 and r["logloss"] > 0 for r in records)
    config = json.loads((work / "lr-run" / "config.json").read_text())
    assert config["ranks"] == 1 and config["config"]["model"] == "lr"
    checkpoints = work / "lr-run" / "checkpoints"
    assert (checkpoints / "latest").read_text().strip() == "step-00000008"
    assert (checkpoints / "step-00000004" / "manifest.json").is_file()


# --unadmitted init (every id its own row from its first occurrence): these runs test resume and
# re-sharding; admission (--min-count 2, W&D's auto) is tested across N in tests/test_exactness.py.
RESUME_FLAGS = ["--model", "wdl", "--dtype", "float64", "--checkpoint-every", "4", "--ttl", "4", "--unadmitted", "init"]
# (ranks, run it resumes, at step): the same rank count, fewer -> more, more -> fewer; each resumes
# a periodic checkpoint of another run and goes on to step 12.
RESUMES = {"1to1": (1, "straight", 4), "1to2": (2, "straight", 4), "2to1": (1, "1to2", 8)}


@pytest.fixture(scope="module")
def resume_runs(work: Path) -> dict[str, Path]:
    """12 steps straight on 1 rank (checkpoints at 4, 8, 12), and the resumed runs of RESUMES. The
    2-rank resume runs in one launch with the other 2-rank runs of the straight run's data: alltoall
    from scratch and des.evaluate of the straight run on its rows reversed (their stdout: ``"stdout"``)."""
    train(work, 1, "straight", *RESUME_FLAGS, "--max-steps", "12")
    runs = {"straight": work / "straight" / "checkpoints"}
    rows = (work / "small.tsv").read_text().splitlines()
    (work / "reversed.tsv").write_text("\n".join(rows[::-1]) + "\n")
    others = {"alltoall": train_args(work, "alltoall", *RESUME_FLAGS, "--max-steps", "12", "--strategy", "alltoall"),
              "evaluate-2": ["-m", "des.evaluate", "--checkpoint", str(runs["straight"]), "--data",
                             str(work / "reversed.tsv"), "--cache-dir", str(work / "cache"), "--predictions",
                             str(work / "predictions-2.txt")]}
    for name, (ranks, source, step) in RESUMES.items():
        args = train_args(work, name, *RESUME_FLAGS, "--max-steps", "12", "--resume",
                          str(runs[source] / f"step-{step:08d}"))
        if ranks == 1:
            run_here(args)
        else:
            runs["stdout"] = run_mpi_many(ranks, {name: args, **others}, work / "two-ranks")
        runs[name] = work / name / "checkpoints"
    return runs


@pytest.mark.mpi
@pytest.mark.parametrize("name", list(RESUMES))
def test_resume_equals_straight_run(resume_runs, work: Path, name: str) -> None:
    assert_checkpoints_equal(resume_runs["straight"], resume_runs[name])
    tail = summary(work, name)
    assert tail["ranks"] == RESUMES[name][0]
    assert tail["steps"] == 12 and tail["steps_this_run"] == 12 - RESUMES[name][2]
    waits = tail["ms_waiting_by_rank"]  # one machine: each rank's wait for the last to enter, by site
    assert (waits == {}) if tail["ranks"] == 1 else (waits and all(len(v) == 2 and min(v) >= 0 for v in waits.values()))
    if tail["ranks"] > 1:  # des/planner.py's prediction (--plan auto: its cheapest plan), printed at start-up
        assert tail["planner"]["plan"] == tail["planner"]["cheapest_plan"] == tail["plan"]
        # (from the distinct ids of the first 4 batches; the run's batches differ a little)
        assert tail["planner"]["predicted_bytes_per_step"] == pytest.approx(tail["bytes_per_step"], rel=0.05)
    assert tail["test_logloss"] == pytest.approx(summary(work, "straight")["test_logloss"], rel=1e-9)


def test_a_resumed_run_predicts_the_table_memory_of_a_fresh_one(work: Path) -> None:
    """The start-up report's table memory at the data's keys: a resumed run's tables are the
    checkpoint's, not sized at start, but they grow to the same rows (the admitted keys': deepfm's
    --min-count 2), so it predicts what the fresh run predicted."""
    flags = ["--model", "deepfm", "--table-capacity", "0", "--checkpoint-every", "2"]
    fresh = train(work, 1, "sized", *flags, "--max-steps", "2").stdout
    resumed = train(work, 1, "sized-resumed", *flags, "--max-steps", "4", "--resume", str(work / "sized")).stdout
    predicted = [re.findall(r"distinct ids, tables ~ *([\d.]+) MiB", out) for out in (fresh, resumed)]
    assert "resumed from" in resumed and predicted[0] and predicted[1] == predicted[0], predicted


@pytest.mark.mpi
def test_evaluate_with_other_rank_counts(resume_runs, work: Path) -> None:
    checkpoint = str(resume_runs["straight"])
    rows = (work / "small.tsv").read_text().splitlines()
    # 1 rank on the rows, 2 ranks on the same rows reversed (resume_runs): rank count and input order at once.
    proc = run_here(["-m", "des.evaluate", "--checkpoint", checkpoint, "--data", str(work / "small.tsv"),
                     "--cache-dir", str(work / "cache"), "--predictions", str(work / "predictions-1.txt")])
    outputs = {ranks: (np.loadtxt(work / f"predictions-{ranks}.txt"), float(stdout.split("auc ")[1].split()[0]))
               for ranks, stdout in ((1, proc.stdout), (2, resume_runs["stdout"]["evaluate-2"]))}
    labels = np.array([int(line.split("\t", 1)[0]) for line in rows])
    p1, auc1 = outputs[1]
    assert p1.shape == labels.shape  # one probability per input row
    np.testing.assert_allclose(outputs[2][0], p1[::-1], rtol=1e-9)  # in input order, on any N
    assert auc1 == pytest.approx(roc_auc_score(labels, p1), abs=1e-6)
    assert outputs[2][1] == pytest.approx(auc1, abs=1e-6)


def test_user_model_from_a_plugin_trains(work: Path) -> None:
    """docs/models.md's example: a substitution and a model defined outside the package, trained by
    des.train. (That it trains exactly on 2 ranks, under des, alltoall and ps, is
    tests/test_check.py's python -m des.check on it.)"""
    flags = ["--plugins", str(REPO / "examples" / "field_weighted_lr.py"), "--model", "fwlr",
             "--dtype", "float64", "--max-steps", "6"]
    proc = train(work, 1, "fwlr-1", *flags)
    assert "done: fwlr on 1 rank(s)" in proc.stdout
    importance = checkpoint_arrays(work / "fwlr-1" / "checkpoints")["field-020.dense.npz/0:field_weighted_linear:importance__value"]
    assert importance.shape == (1,) and importance[0] != 1.0  # the field weight was trained


@pytest.mark.mpi
def test_alltoall_strategy_trains_the_same_model(resume_runs, work: Path) -> None:
    """--strategy alltoall (= des --plan exchange: embeddings exchanged, dense gradients
    AllReduced) ends where DES ends."""
    stdout = resume_runs["stdout"]["alltoall"]  # trained from scratch on 2 ranks (resume_runs)
    assert "with strategy alltoall" in stdout
    # the balanced placement weighs each field's work on the first batch with its table's ids
    shares = [float(x) for x in re.findall(r"rank \d: +\d+ fields, .* ([\d.]+)% of the work", stdout)]
    assert len(shares) == 2 and sum(shares) == pytest.approx(100, abs=0.2), stdout
    assert "work per step (ids, distinct ids, rows of a batch): largest rank" in stdout
    assert_checkpoints_equal(resume_runs["straight"], work / "alltoall" / "checkpoints")
    s = summary(work, "alltoall")
    assert s["strategy"] == "alltoall"
    sent = s["bytes_per_step_by_site"]
    assert sent["exchange_values"] > 0 and sent["exchange_gradients"] > 0 and sent["top_gradients"] > 0
    assert sent["partials_reduce_scatter"] == sent["gradient_allgather"] == 0  # nothing is split
    # predicted from the distinct ids of the first 4 batches; the run's 12 batches differ a little
    assert s["planner"]["plan"] == {"linear": "exchange", "first_fc": "exchange"}
    assert s["planner"]["predicted_bytes_per_step"] == pytest.approx(s["bytes_per_step"], rel=0.05)
    assert "this run: --plan exchange, predicted" in stdout
    assert s["test_logloss"] == pytest.approx(summary(work, "straight")["test_logloss"], rel=1e-9)


@pytest.mark.mpi
def test_parameter_server_is_asynchronous(work: Path) -> None:
    """--strategy ps: one server, two workers that do not wait for each other."""
    proc = train(work, 3, "ps", "--model", "deepfm", "--strategy", "ps", "--epochs", "3")
    s = summary(work, "ps")
    assert s["strategy"] == "ps" and s["steps"] == 3 * (1800 // 256)
    assert s["train_samples"] == s["steps"] * 256
    assert 0.55 < s["test_auc"] < 1.0
    # Real staleness: some dense gradients were computed on weights that others updated since.
    assert s["staleness_max"] >= 1, proc.stdout
    # The same run folder as the synchronous strategies (no checkpoints: a baseline).
    config = json.loads((work / "ps" / "config.json").read_text())
    assert config["ranks"] == 3 and config["config"]["strategy"] == "ps" and config["placement"][1:] == [[], []]
    record = json.loads((work / "ps" / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["step"] == s["steps"] and 0.5 < record["auc"] < 1.0
    assert "1 server(s), 2 asynchronous worker(s)" in proc.stdout and "  config: model=deepfm" in proc.stdout


# ---------------------------------------------------------------------------------------------- bad input
def expect_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, f"{fragment!r} not in:\n{proc.stderr}"


def test_unknown_model_and_bad_flags(work: Path) -> None:
    expect_error(train(work, 1, "bad1", "--model", "nope", check=False), "unknown model 'nope'")
    # Other flag values are checked in-process (tests/test_config.py) and on 3 ranks below.
    expect_error(train(work, 1, "bad4", "--embedding-optimizer", "adam:lr=x", check=False), "--embedding-optimizer")


def test_a_bad_flag_on_several_ranks_is_one_line(work: Path) -> None:
    proc = run_mpi(3, ["-m", "des.train", "--dtype", "float16"], check=False, timeout=60)
    expect_error(proc, "[rank 0] des.train: error: argument --dtype: invalid choice: 'float16'")
    assert len(proc.stderr.strip().splitlines()) == 1 and "usage:" not in proc.stderr, proc.stderr
    proc = run_mpi(2, ["-m", "des.train", "--split", "a,b"], check=False, timeout=60)
    expect_error(proc, "--split: split 'a,b' is not three comma-separated numbers")


def test_progress_bar_quiet_ranks_and_one_class_splits(work: Path) -> None:
    """Under mpirun a rank's stderr is a pipe; the bar still shows when the user's terminal is.
    Only rank 0 talks, once, and TensorFlow's start-up messages are suppressed by des itself
    (the TF_* variables the other tests set are removed here). The labels are all 0 (one-class
    splits): training works, validation and test AUC are n/a (null in the summary), and
    each split's warning comes once, from one rank."""
    import os
    import pty

    lines = (work / "small.tsv").read_text().splitlines()
    (work / "negatives.tsv").write_text("".join("0" + line[1:] + "\n" for line in lines))
    env = {k: v for k, v in mpi_env(2).items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS", *NO_KERAS)}
    master, slave = pty.openpty()
    cmd = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "des.train", "--data", str(work / "negatives.tsv"),
           "--cache-dir", str(work / "cache"), "--output", str(work / "bar"), *SMALL, "--progress",
           "--model", "lr", "--max-steps", "3"]
    job = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    output = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not chunk:
                break
            output += chunk
        assert job.wait(timeout=240) == 0, output.decode(errors="replace")
    finally:
        os.close(master)
        if job.poll() is None:
            job.kill()
    text = output.decode(errors="replace")
    assert "3/3" in text and "loss=" in text and "sps=" in text, text  # tqdm: steps, loss, samples/s
    assert "<00:00" in text or "<?" in text  # tqdm's ETA field
    assert text.count("des.train: lr") == 1 and text.count("done: lr") == 1, text
    # des names the oneDNN setting in its own start-up report; TensorFlow's banner must not show
    assert not re.search(r"tensorflow|oneDNN custom|cuda|absl|^[IWE]0000", text, re.IGNORECASE | re.MULTILINE), text
    s = summary(work, "bar")
    assert s["validation_auc"] is None and s["test_auc"] is None
    assert s["test_logloss"] > 0 and s["steps"] == 3
    assert "val auc n/a" in text and "test AUC n/a" in text
    assert text.count("warning: AUC is undefined on the validation split") == 1, text
    assert text.count("warning: AUC is undefined on the test split") == 1, text


def test_missing_and_malformed_data(work: Path) -> None:
    # One rank, in this process: reading the data is rank 0's alone (a rank failing while the
    # others wait ends the job: test_bad_checkpoints, tests/test_run_folder.py).
    proc = run_here(["-m", "des.train", "--data", str(work / "nope.tsv"), "--no-progress"], check=False)
    expect_error(proc, "nope.tsv", "no such file")
    bad = work / "bad.tsv"
    lines = (work / "small.tsv").read_text().splitlines()[:50]
    lines[16] = lines[16].replace("\t", "\tx", 1)  # label column ok, I1 gets a non-integer
    bad.write_text("\n".join(lines) + "\n")
    proc = run_here(["-m", "des.train", "--data", str(bad), "--cache-dir", str(work / "cache"), "--no-progress"],
                    check=False)
    expect_error(proc, "bad.tsv:17", "I1")
    assert not list((work / "cache").glob("bad*"))  # nothing half-written in the cache
    empty = work / "empty.tsv"
    empty.write_text("")
    proc = run_here(["-m", "des.train", "--data", str(empty), "--cache-dir", str(work / "cache"), "--no-progress"],
                    check=False)
    expect_error(proc, "empty")


def test_bad_plans(work: Path) -> None:
    """--plan: an unknown operator or mode, and an exchange with the replicated upper network, each
    one line naming the choices, before anything is written."""
    proc = train(work, 1, "badplan", "--plan", "first_fc=sometimes", check=False)
    expect_error(proc, "--plan 'first_fc=sometimes': operators are linear, fm2, first_fc; modes partials, exchange")
    proc = train(work, 1, "badplan", "--plan", "exchange", "--upper", "replicated", check=False)
    expect_error(proc, "--plan exchange: the replicated upper network")
    assert not (work / "badplan").exists()


def test_batch_larger_than_data(work: Path) -> None:
    expect_error(train(work, 1, "bad5", "--batch-size", "100000", check=False), "larger than the")


def test_more_ranks_than_fields(work: Path) -> None:
    from des.data.synth import default_config, synthesize_store

    config = default_config(seed=0, vocab_scale=0.001)
    narrow = type(config)(fields=config.fields[:1], seed=0)
    synthesize_store(work / "narrow", 500, narrow)
    proc = run_mpi(2, ["-m", "des.train", "--data", str(work / "narrow"), "--no-progress"], check=False)
    expect_error(proc, "2 ranks but the data has only 1 fields")


def test_unwritable_output(work: Path) -> None:
    (work / "a-file").write_text("x")
    proc = run_here(["-m", "des.train", "--data", str(work / "small.tsv"), "--cache-dir", str(work / "cache"),
                     "--output", str(work / "a-file" / "run"), "--no-progress"], check=False)
    expect_error(proc, "is not writable")


def test_bad_checkpoints(work: Path, resume_runs) -> None:
    """End to end through des.train; the other refusals (another model or settings, a manifest
    without its model, a missing folder) are checked in-process in tests/test_checkpoint.py."""
    import shutil

    from des.checkpoint import resolve_checkpoint

    checkpoint = resume_runs["straight"]
    corrupt = work / "corrupt"
    shutil.copytree(checkpoint, corrupt)
    victim = resolve_checkpoint(corrupt) / "field-005.table"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    proc = train(work, 2, "bad8", "--model", "wdl", "--dtype", "float64", "--resume", str(corrupt), check=False)
    expect_error(proc, "field-005.table is corrupt")
    # One line for the job, from the rank that failed, the one placed with field 5 (no launcher banner).
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and re.fullmatch(r"\[rank [01]\] " + re.escape(
        f"des.train: error: checkpoint file {resolve_checkpoint(corrupt) / 'field-005.table'} is corrupt "
        "(sha256 mismatch)"), lines[0]), proc.stderr
    proc = train(work, 1, "bad10", *RESUME_FLAGS, "--batch-size", "128", "--resume", str(checkpoint), check=False)
    expect_error(proc, "another batch order (batch_size 256 vs 128)")
    # A run that fails while setting up leaves no run folder behind.
    assert not (work / "bad8").exists() and not (work / "bad10").exists()


@pytest.mark.mpi
def test_killed_rank_ends_the_job(work: Path) -> None:
    cmd = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "des.train", "--data", str(work / "small.tsv"),
           "--cache-dir", str(work / "cache"), "--output", str(work / "killed"), *SMALL, "--model", "lr",
           "--epochs", "100000", "--early-stop", "0"]
    job = subprocess.Popen(cmd, cwd=REPO, env=mpi_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (work / "killed" / "config.json").exists():  # training has started
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "training did not start"
            time.sleep(0.2)
        ranks = [p for p in psutil.Process(job.pid).children(recursive=True) if "des.train" in " ".join(p.cmdline())]
        assert len(ranks) == 2
        # The job's MPICH segment: mapped by the ranks, its name already unlinked (nothing to leak
        # when the launcher SIGKILLs the survivor, which runs no handler).
        segments = {line.split("/dev/shm/")[1].removesuffix(" (deleted)") for line in
                    Path(f"/proc/{ranks[0].pid}/maps").read_text().splitlines() if "/dev/shm/mpich_" in line}
        assert segments and not segments & mpich_shm()
        killed_at = time.monotonic()
        ranks[-1].send_signal(signal.SIGKILL)
        job.wait(timeout=60)
        assert time.monotonic() - killed_at < 30
        assert job.returncode != 0
        assert not segments & mpich_shm()  # the survivor was SIGKILLed: nothing ran, nothing leaked
        # The launcher's banner names a rank's pid: the killed one, or the survivor it killed right
        # after, whichever exit it processed first (a race; CI once showed the other); des's
        # start-up lines map every pid to its rank.
        out, err = job.communicate()
        assert re.search(rf"processes: .*rank \d pid {ranks[-1].pid} on ", out), out
        named = [p.pid for p in ranks if f"PID {p.pid} " in out + err]  # hydra's banner (on stdout)
        assert named and re.search(rf"processes: .*rank \d pid {named[0]} on ", out), (out, err)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()


def test_a_diverging_run_stops_with_one_line(work: Path) -> None:
    """A non-finite training loss ends the job at that step with one line (the optimizers divide as
    TensorFlow does, so a divergence shows up as inf/NaN, not as an exception), on one rank and on
    two, where every rank holds the same loss and one of them says it."""
    flags = ["--data", str(work / "small.tsv"), "--cache-dir", str(work / "cache"), *SMALL,
             "--dense-optimizer", "sgd:lr=1e30", "--max-steps", "6"]
    for proc in (run_here(["-m", "des.train", "--output", str(work / "diverge1"), *flags], check=False),
                 run_mpi(2, ["-m", "des.train", "--output", str(work / "diverge2"), *flags], check=False, timeout=120)):
        expect_error(proc, "des.train: error: step ", "the training loss is ", "training diverged")
        assert proc.stderr.count("error:") == 1, proc.stderr


def test_data_without_validation_rows_says_each_epoch_once(work: Path) -> None:
    """``--split 1,0,0``: each epoch's end writes its line (train loss and throughput, no validation
    metrics) and the end of the run adds none: the last step's line is not repeated with the mean
    loss of no steps."""
    proc = train(work, 1, "no-validation-rows", "--model", "lr", "--epochs", "2", "--split", "1,0,0")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["7", "14"], proc.stdout
    assert not any("val auc" in line or "train loss 0.0000" in line for line in lines), lines
    records = [json.loads(line) for line in (work / "no-validation-rows" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [7, 14] and all(r["train_loss"] > 0 for r in records)


def test_a_steps_time_counts_reading_its_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """samples/s is over the steps' wall time including reading each batch: a reader that takes
    0.2 s a batch bounds it by batch / 0.2 s (the step alone takes a few ms here)."""
    from des import runner
    from des.collectives import Communicator
    from des.config import load_config
    from des.run import Run
    from des.startup import setup

    criteo_head(tmp_path / "small.tsv", 600)
    config = load_config(["--data", str(tmp_path / "small.tsv"), "--cache-dir", str(tmp_path / "cache"),
                          "--output", str(tmp_path / "run"), "--model", "lr", "--batch-size", "64", "--max-steps", "4",
                          "--eval-every", "100", "--pipeline", "off", "--no-progress"])
    run = setup(config, Communicator())
    read = Run.batch

    def slow_read(self, at):
        time.sleep(0.2)
        return read(self, at)

    monkeypatch.setattr(Run, "batch", slow_read)
    runner.loop(run)
    run.strategy.close()
    assert run.meter.steps == 4 and run.meter.seconds >= 3 * 0.2  # the first step is not timed
    assert run.meter.samples_per_second <= 64 / 0.2


def test_tables_are_sized_from_the_data(tmp_path: Path) -> None:
    """``--table-capacity 0`` (the default): each field's table starts with room for its distinct
    keys in the data, so an epoch inserts them all without growing (no rehash, no rows moved); a
    capacity N starts every table at N slots, and they grow. Without counts (the tables of a
    resumed or evaluated checkpoint replace these) a table starts at the default size."""
    from des import runner
    from des.collectives import Communicator
    from des.config import load_config
    from des.options import TableOptions
    from des.startup import setup

    criteo_head(tmp_path / "small.tsv", 1200)
    grown = {}
    for capacity in ("0", "64"):
        config = load_config(["--data", str(tmp_path / "small.tsv"), "--cache-dir", str(tmp_path / "cache"),
                              "--output", str(tmp_path / capacity), "--model", "fm", "--batch-size", "128",
                              "--epochs", "1", "--eval-every", "0", "--table-capacity", capacity, "--no-progress"])
        run = setup(config, Communicator())
        tables = run.strategy.shard.tables
        start = {f: (t.capacity, t.memory()["row_capacity"], t.version) for f, t in tables.items()}
        distinct = [run.store.distinct_count(f) for f in sorted(tables)]
        runner.loop(run)
        run.strategy.close()
        grown[capacity] = [f for f, t in tables.items() if (t.capacity, t.memory()["row_capacity"], t.version) != start[f]]
        assert all(0 < len(t) <= t.memory()["row_capacity"] for t in tables.values())
        if capacity == "0":
            assert [start[f][1] for f in sorted(tables)] == [max(16, d + 1) for d in distinct]
    assert grown["0"] == [] and len(grown["64"]) > 10
    assert TableOptions(0, distinct=(5,)).initial_size(0)[1] == 6
    assert TableOptions(0, distinct=(3 * 10**9,)).initial_size(0)[0] == 2**32  # the index's limit
    assert TableOptions(0).initial_size(3) == (1 << 14, None)  # no counts (a resumed or evaluated checkpoint)
