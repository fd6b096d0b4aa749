"""Only the C part of the package; everything else is in pyproject.toml.

ingero/export/_wire.c speeds up the Perfetto export's per-event loops.  It is
optional: when it cannot be built (no compiler, no Python headers) the export
uses the same code in numpy, slower.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("ingero.export._wire", ["ingero/export/_wire.c"],
                             extra_compile_args=["-O2"], optional=True)])
