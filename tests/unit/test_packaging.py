"""What a wheel ships: every subpackage, the schema, the BPF sources."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed_for_the_wheel() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(conf["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ingero").rglob("__init__.py")}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert conf["package-dir"]["ingero.bpf"] == "bpf"


def test_bpf_sources_are_package_data() -> None:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = conf["package-data"]["ingero.bpf"]
    for src in (ROOT / "bpf").iterdir():
        if src.suffix in (".c", ".h"):
            assert any(src.match(p) for p in patterns), src.name


def test_the_nvtx_injection_source_is_package_data() -> None:
    """`ingero trace --cmd` compiles it where it was installed (collect/nvtx_inject.py)."""
    from ingero.collect import nvtx_inject

    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert any(nvtx_inject.SOURCE.match(p) for p in conf["package-data"]["ingero.collect"])
