"""Bad values on the command line: one line naming the flag, exit 2, before anything runs."""

import pytest

from ingero.cli import main


@pytest.mark.parametrize("argv, words", [
    (["trace", "--duration", "nan"], "bad --duration: 'nan' is not a finite number"),
    (["trace", "--duration", "inf"], "bad --duration: 'inf' is not a finite number"),
    (["trace", "--cmd", ""], "bad --cmd: empty command"),
    (["trace", "--ring-mb", "nan"], "bad --ring-mb"),
    (["trace", "--max-db", "nanGB"], "bad --max-db"),
    (["explain", "--since", "nan"], "bad --since: 'nan' is not a finite number"),
    (["explain", "--window", "nan"], "bad --window: 'nan' is not a finite number"),
    (["explain", "--window", "0.000001s"], "below the floor of 1 s"),
    (["explain", "--from", "inf"], "bad --from"),
    (["explain", "--pid", "-4"], "bad --pid"),
    (["query", "--max-rows", "0", "SELECT 1"], "bad --max-rows"),
    (["query", "--timeout", "nan", "SELECT 1"], "bad --timeout"),
])
def test_bad_values_are_one_line_and_exit_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("INGERO_DB", str(tmp_path / "none.duckdb"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
