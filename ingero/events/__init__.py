"""The event contract: the Python side of ``bpf/events.h``, imported by every layer.

``ops`` is the op table (names stored in ``events.op``, categories, tracepoints),
``records`` the mirror of the record structs and enums (numpy dtypes for decoding,
checked against events.h by tests/unit/test_records_parity.py), ``units`` the
time units every timestamp and duration is counted in.  Nothing here imports
the rest of ingero; import from the module that defines a name.
"""
