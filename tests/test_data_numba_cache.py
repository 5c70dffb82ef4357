"""The numba cache guard (des/_numba_cache.py): kernels that inline helpers of another module of
their package must not keep running the old helper after that module changed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from des import _numba_cache

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import des, des.data.tsv as tsv
from des.data.features import HEX_DIGITS
assert des.__file__.startswith({root!r}), des.__file__
# the parser's hex digits are features.py's table, a global frozen into the compiled tsv.py kernel
with open("line.tsv", "w") as out:
    out.write("0" + "\\t" * 14 + "0000000a" + "\\t" * 25 + "\\n")
chunk = next(iter(tsv.CriteoTsvReader().read(["line.tsv"])))
print(int(chunk.columns["C1"][0]), int(HEX_DIGITS[ord("a")]))
"""


def _copy_data_package(root: Path) -> Path:
    """A copy of des/data (and what it imports from des) under ``root``, with no numba cache."""
    (root / "des").mkdir()
    for name in ("__init__.py", "_numba_cache.py", "errors.py", "metrics.py", "splitmix.py"):
        shutil.copy(REPO / "des" / name, root / "des" / name)
    shutil.copytree(REPO / "des" / "data", root / "des" / "data", ignore=shutil.ignore_patterns("__pycache__"))
    return root / "des" / "data"


def _probe(root: Path) -> list[int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(root=str(root))], cwd=root, env=env, capture_output=True, text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return [int(x) for x in proc.stdout.split()]


def test_changed_key_helper_reaches_cached_parser_kernel(tmp_path):
    package = _copy_data_package(tmp_path)
    assert _probe(tmp_path) == [10, 10]
    cached = list((package / "__pycache__").glob("tsv._parse_block-*.nbi"))
    assert cached, "the parser kernel was not cached; the test would prove nothing"
    features = package / "features.py"
    source = features.read_text()
    assert source.count("table[ord(char)] = value") == 1
    features.write_text(source.replace("table[ord(char)] = value", "table[ord(char)] = value + 1000 * (char == 'a')"))
    # without the guard numba would load tsv.py's cached kernel (tsv.py did not change): 10, 1010
    assert _probe(tmp_path) == [1010, 1010]
    stamp = package / "__pycache__" / "des_data_sources.sha256"
    assert stamp.read_text().strip() == _numba_cache.source_digest(str(package))  # reset once only


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_guard_removes_only_this_packages_cache_files_when_a_source_changes(tmp_path, monkeypatch):
    from numba.core import config

    package = tmp_path / "pkg"
    (package / "a.py").parent.mkdir()
    (package / "a.py").write_text("X = 1\n")
    (package / "b.py").write_text("Y = 2\n")
    user_dir = tmp_path / "numba_cache"
    monkeypatch.setattr(config, "CACHE_DIR", str(user_dir))
    dirs = _numba_cache.cache_dirs(str(package))
    assert dirs[0] == str(package / "__pycache__") and dirs[1].startswith(str(user_dir))

    def populate() -> list[Path]:
        return [_touch(Path(d) / name) for d in dirs for name in ("a.f-3.py311.nbi", "b.g-7.py311.1.nbc")]

    keep = [_touch(package / "__pycache__" / "a.cpython-311.pyc"), _touch(package / "__pycache__" / "c.f-1.py311.nbi")]
    files = populate()
    assert _numba_cache.guard(str(package), "pkg.sha256") is True  # no stamp yet: stale by default
    assert not any(p.exists() for p in files) and all(p.exists() for p in keep)
    digest = _numba_cache.source_digest(str(package))
    assert all((Path(d) / "pkg.sha256").read_text().strip() == digest for d in dirs)

    files = populate()
    assert _numba_cache.guard(str(package), "pkg.sha256") is False  # unchanged sources: cache kept
    assert all(p.exists() for p in files)

    (package / "b.py").write_text("Y = 3\n")  # a change in any module invalidates every module
    assert _numba_cache.source_digest(str(package)) != digest
    assert _numba_cache.guard(str(package), "pkg.sha256") is True
    assert not any(p.exists() for p in files) and all(p.exists() for p in keep)


def test_guard_ignores_unwritable_cache(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("X = 1\n")
    (package / "__pycache__").write_text("not a directory")  # makedirs and open fail: no error
    assert _numba_cache.guard(str(package), "pkg.sha256") is False
