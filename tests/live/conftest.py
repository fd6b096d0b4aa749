"""Fixtures shared by the live tests (the simulated runtime's ``simcuda`` is in tests/conftest.py)."""
