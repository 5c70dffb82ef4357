"""Synthetic data: reproducible oracle, multi-hot CSR, TSV round trip, CLI."""

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from des.data import DataError, FieldBatch, prepare
from des.data.__main__ import main
from des.data.synth import (
    BLOCK_ROWS,
    SynthConfig,
    SyntheticGenerator,
    default_config,
    synthesize_store,
    synthesize_tsv,
)

SMALL = dict(vocab_scale=0.01, calibration_rows=BLOCK_ROWS)


@pytest.fixture(scope="module")
def multi_hot_store(tmp_path_factory):
    config = default_config(seed=3, multi_hot_fields=("C2", "C9"), max_hot=4, **SMALL)
    return synthesize_store(tmp_path_factory.mktemp("synth") / "store", 6000, config, split=(0.5, 0.1, 0.4))


def test_oracle_auc_matches_sklearn_and_regenerates(multi_hot_store, tmp_path):
    manifest = multi_hot_store.manifest
    oracle = manifest["synthetic"]["oracle"]
    test_rows = multi_hot_store.split_rows("test")
    labels = np.asarray(multi_hot_store.labels)[test_rows]
    probabilities = np.asarray(multi_hot_store.array("probabilities"))[test_rows]
    assert oracle["rows"] == len(test_rows) > 2000
    assert oracle["auc"] == pytest.approx(roc_auc_score(labels, probabilities), abs=1e-12)
    assert 0.7 < oracle["auc"] < 0.95
    assert 0.2 < manifest["positive_rate"] < 0.3
    # regenerate from the manifest alone: same bias, same probabilities, same oracle AUC
    config = SynthConfig.from_dict(manifest["synthetic"]["config"])
    assert SyntheticGenerator(config).bias == manifest["synthetic"]["calibrated_bias"]
    rows, split = manifest["synthetic"]["rows"], manifest["split"]["fractions"]
    again = synthesize_store(tmp_path / "again", rows, config, split=split)
    assert again.manifest["synthetic"]["oracle"] == oracle
    assert (np.asarray(again.array("probabilities")) == np.asarray(multi_hot_store.array("probabilities"))).all()
    assert (np.asarray(again.labels) == np.asarray(multi_hot_store.labels)).all()


def test_multi_hot_csr_matches_generator(multi_hot_store):
    generator = SyntheticGenerator(SynthConfig.from_dict(multi_hot_store.manifest["synthetic"]["config"]))
    field = multi_hot_store.field_index("C2")
    offsets, keys, weights = multi_hot_store.field(field)
    assert weights is None and not multi_hot_store.is_one_hot(field) and multi_hot_store.is_one_hot("C3")
    stored_rows = [list(keys[offsets[r] : offsets[r + 1]]) for r in range(multi_hot_store.num_rows)]
    generated_rows = []
    for block in generator.blocks(multi_hot_store.num_rows):
        column = block.columns[field]
        assert isinstance(column, FieldBatch)
        generated_rows += [list(column.keys[a:b]) for a, b in zip(column.offsets[:-1], column.offsets[1:])]
    assert stored_rows == generated_rows
    lengths = np.diff(offsets)
    assert lengths.min() == 0 and lengths.max() == 4 and abs(lengths.mean() - 2.0) < 0.1
    entry = multi_hot_store.manifest["fields"][field]
    assert entry["hotness"] == "multi-hot" and entry["nnz"] == len(keys)
    assert entry["distinct"] == len(np.unique(keys))


def test_smaller_dataset_is_a_prefix(tmp_path):
    config = default_config(seed=4, **SMALL)
    small = synthesize_store(tmp_path / "small", 1000, config)
    large = synthesize_store(tmp_path / "large", BLOCK_ROWS + 10, config)
    for field in (0, 20, 38):
        assert (np.asarray(large.field(field)[1][:1000]) == np.asarray(small.field(field)[1])).all()
    assert (np.asarray(large.labels[:1000]) == np.asarray(small.labels)).all()


def test_tsv_round_trip_gives_the_same_keys(tmp_path):
    config = default_config(seed=6, **SMALL)
    store = synthesize_store(tmp_path / "store", 3000, config)
    info = synthesize_tsv(tmp_path / "data.tsv.gz", 3000, config)
    prepared = prepare(tmp_path / "data.tsv.gz", tmp_path / "prepared", seed=6)  # synth splits with its seed
    assert info["rows"] == prepared.num_rows == 3000
    assert (np.asarray(prepared.labels) == np.asarray(store.labels)).all()
    assert (np.asarray(prepared.split) == np.asarray(store.split)).all()
    for field in range(39):
        assert (np.asarray(prepared.field(field)[1]) == np.asarray(store.field(field)[1])).all()


def test_tsv_cannot_hold_multi_hot(tmp_path):
    config = default_config(multi_hot_fields=("C1",), **SMALL)
    with pytest.raises(DataError, match="multi-hot"):
        synthesize_tsv(tmp_path / "x.tsv", 10, config)
    assert list(tmp_path.iterdir()) == []


def test_cli_synth_and_inspect(tmp_path, capsys):
    out = tmp_path / "cli"
    arguments = ["synth", "--rows", "2000", "--output", str(out), "--multi-hot", "--weighted", "--vocab-scale", ".01"]
    status = main(arguments)
    assert status == 0
    assert "oracle test AUC" in capsys.readouterr().out
    assert main(["inspect", str(out)]) == 0
    report = capsys.readouterr().out
    assert "rows         2,000" in report and "oracle on test" in report
    assert report.count("multi-hot") == 3 and report.count("one-hot") == 36
    assert main(["inspect", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err.startswith("des.data: error: ")


def test_zipf_scale_0_with_a_large_vocabulary_gives_ids_seen_about_once(tmp_path, capsys):
    """``--zipf-scale 0 --vocab 4294967295``: every value of a categorical field's vocabulary of 2^32
    equally likely, so its ids are all distinct but for its missing values (the cheap way to tables
    of 100M ids); the default skew repeats them."""
    from des.data.store import ColumnStore

    flags = {"flat": ["--zipf-scale", "0", "--vocab", str(2**32 - 1)], "skewed": []}
    for name, extra in flags.items():
        assert main(["synth", "--rows", "2000", "--output", str(tmp_path / name), *extra]) == 0
    flat, skewed = (ColumnStore.open(tmp_path / name) for name in flags)
    config = default_config(zipf_scale=0, categorical_vocab=2**32 - 1)
    categorical = [f for f, spec in enumerate(config.fields) if spec.kind == "categorical"]
    assert len(categorical) == 26 and {config.fields[f].vocab for f in categorical} == {2**32 - 1}
    for f in categorical:  # the missing values share one key; a collision in 2^32 is unlikely
        seen = 2000 * (1 - config.fields[f].missing)
        assert 0.9 * seen <= flat.distinct_count(f) <= seen + 100, config.fields[f]
    assert sum(skewed.distinct_count(f) for f in categorical) < 0.5 * sum(flat.distinct_count(f) for f in categorical)
    with pytest.raises(DataError, match="zipf_scale must be >= 0"):
        default_config(zipf_scale=-1)


def test_the_criteo_schema_synthesizes_like_any_schema(tmp_path, capsys):
    """``--schema criteo``: the schemas' generator, its TSV prepared by Criteo's reader to the keys
    of the store it writes directly (no schema recorded: the built-in criteo's)."""
    from des.data import ColumnStore

    for args in (["--format", "tsv", "--output", str(tmp_path / "c.tsv")], ["--output", str(tmp_path / "direct")]):
        assert main(["synth", "--schema", "criteo", "--rows", "300", *args]) == 0
    direct, prepared = ColumnStore.open(tmp_path / "direct"), prepare(tmp_path / "c.tsv", tmp_path / "prepared")
    assert direct.schema is None and direct.manifest["key_scheme"]["version"] == 1
    assert (np.asarray(direct.labels) == np.asarray(prepared.labels)).all()
    for field in range(39):
        np.testing.assert_array_equal(direct.field(field)[1], prepared.field(field)[1])
    assert "oracle test AUC" in capsys.readouterr().out
