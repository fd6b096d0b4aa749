"""docs/rules.md lists every rule id and every threshold name, so the doc cannot drift silently."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path

from ingero.analyze.rules import registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "rules.md"


def test_every_rule_and_threshold_is_documented():
    text = DOC.read_text()
    for rule in registry():
        assert f"`{rule.ID}`" in text, rule.ID
        assert is_dataclass(rule.Thresholds) and rule.Thresholds.__dataclass_params__.frozen
        for f in fields(rule.Thresholds):
            assert f"`{f.name}`" in text.split(f"**{rule.ID}**", 1)[1].split("**", 1)[0], (rule.ID, f.name)


def test_rule_modules_declare_the_contract():
    ids = [r.ID for r in registry()]
    assert len(ids) == len(set(ids))
    for rule in registry():
        assert rule.TITLE and callable(rule.evaluate)
