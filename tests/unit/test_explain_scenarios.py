"""Every demo scenario's synthetic replay: explain ranks the expected rule first, healthy stays silent."""

from __future__ import annotations

import pytest

from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.demo import scenarios, synthetic
from ingero.store.db import Store


@pytest.mark.parametrize("name", scenarios.names())
def test_scenario_top_chain(name):
    sc = scenarios.get(name)
    store = Store.memory()
    replay = synthetic.generate(sc, duration_s=30, start_ns=1_763_800_000 * 10**9)
    synthetic.write(store, sc, replay, label="slow")
    report = explain(store.con, Options())
    serious = [c for c in report.chains if c.severity in ("HIGH", "MEDIUM")]
    if sc.expected_rule is None:
        assert serious == []
    else:
        assert report.chains[0].rule_id == sc.expected_rule
        assert report.chains[0].severity == "HIGH"
        assert report.chains[0].evidence_windows


@pytest.mark.parametrize("name", [n for n in scenarios.names() if scenarios.get(n).expected_rule])
def test_fixed_run_loses_the_high_chain(name):
    sc = scenarios.get(name)
    store = Store.memory()
    replay = synthetic.generate(sc, duration_s=20, fixed=True, start_ns=1_763_800_000 * 10**9)
    synthetic.write(store, sc, replay, label="fixed")
    report = explain(store.con, Options())
    assert [c.rule_id for c in report.chains if c.severity == "HIGH"] == []
