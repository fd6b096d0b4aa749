"""The seam between a running trace and the services the trace command wires in.

The session (``collect/session.py``) records and stores; what rides on it
(Prometheus aggregates, summaries, publishing, ...) subclasses ``TraceHook``
and is handed in through ``TraceOptions.hooks``, so collect never imports
the layers above it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


class TraceHook:
    """What a service riding on a trace may be told; every method is optional work, never per event.

    The session calls them on its own (writer) thread, in ``opts.hooks`` order:
    ``on_flush`` after each batch is committed (``recs``: the stored records in
    storage order), ``every_second`` after the second's rows, ``on_end`` after
    the last flush and before the session row is closed.  A hook that fails
    raises: it is the tracer's bug, not the user's.
    """

    def on_program(self, program: Any) -> None:
        """The BPF program is loaded (``loader.Program``) and no library is attached yet."""

    def on_flush(self, sess: Any, recs: "np.ndarray", flush_s: float) -> None:
        pass

    def every_second(self, sess: Any) -> None:
        pass

    def on_end(self, sess: Any) -> None:
        pass

    def close(self) -> None:
        """Release what the hook holds (a port, a thread); called by its owner once the trace is over."""
