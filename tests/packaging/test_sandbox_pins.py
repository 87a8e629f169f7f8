"""The sandbox image's library pins (sandbox-image/wmrl_sandbox/requirements.txt), read as the
trainer reads them for the prompts (wmrl_sandbox.libraries)."""

import pytest

from wmrl_sandbox import libraries


def test_the_sandbox_libraries_are_exact_pins_with_their_import_names():
    pinned = libraries.pinned()
    assert [name for name, _ in pinned] == ["numpy", "pandas", "scipy", "scikit-learn", "xgboost-cpu", "lightgbm"]
    assert libraries.import_names() == ["numpy", "pandas", "scipy", "sklearn", "xgboost", "lightgbm"]
    line = libraries.prompt_line()
    assert line == ", ".join(f"{libraries.PROMPT_NAMES.get(n, n)} {v}" for n, v in pinned)
    assert line.startswith("numpy 2.3.5, pandas 3.1.1, scipy 1.17.1, scikit-learn 1.9.1, xgboost 3.2.0, lightgbm")


@pytest.mark.parametrize("line", ["pandas>=3", "numpy", "torch==2.*", "x==1; python_version<'3.12'", "a[b]==1"])
def test_anything_but_an_exact_pin_is_refused_naming_the_line(tmp_path, line):
    path = tmp_path / "requirements.txt"
    path.write_text(f"# comment\nnumpy==2.3.5\n{line}\n")
    with pytest.raises(ValueError, match=f"requirements.txt:3: .* is not an exact pin"):
        libraries.pinned(path)


def test_the_package_ships_the_requirements_file():
    """The trainer image reads it as package data (pyproject: '*.txt' in every package)."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert "*.txt" in project["tool"]["setuptools"]["package-data"]["*"]
    assert libraries.REQUIREMENTS.is_file() and libraries.REQUIREMENTS.parent.name == "wmrl_sandbox"
