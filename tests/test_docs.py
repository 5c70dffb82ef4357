"""The documentation that is generated stays generated: ``docs/options.md`` is what
``python -m des.option_docs`` writes from the option declarations today, and names every option."""

from __future__ import annotations

from des.config import build_parser
from des.option_docs import OUTPUT, main, render


def test_the_option_reference_is_up_to_date() -> None:
    assert OUTPUT.read_text() == render(), "docs/options.md is out of date: run python -m des.option_docs"
    assert main(["--check"]) == 0


def test_the_option_reference_names_every_option_once(tmp_path) -> None:
    text = render()
    train = text.split("\n## des.data")[0]
    parser = build_parser()
    for action in parser._actions:
        flag = action.option_strings[0] if action.option_strings else ""
        if flag in ("", "-h", "--config"):
            continue
        shown = f"--[no-]{flag[2:]}" if f"--no-{flag[2:]}" in parser._option_string_actions else flag
        assert train.count(f"| `{shown}` |") + train.count(f"| `{shown} {{") == 1, flag
    stale = tmp_path / "options.md"
    stale.write_text(text.replace("| `--batch-size`", "| `--batch-sizes`"))
    assert main(["--check", "--output", str(stale)]) == 1
