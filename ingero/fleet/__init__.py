"""The fleet dataset: every node's tracer publishes closed Parquet segments to one shared ROOT.

  schema.py     the dataset's tables, their Arrow schemas and the one version number
  layout.py     ROOT as a pyarrow filesystem, the hive paths, segment names, atomic writes
  facts.py      node facts: cores, GPUs (NVML), kernel, clock offset and time-sync state
  segment.py    one segment's tables, read from the local store (explain over its span)
  publish.py    the TraceHook: closes segments as the trace runs, catches up from the store
  dataset.py    the reader: partition and time pruning, version checks, a DuckDB over it
  findings.py   fleet explain: straggler (MAD; two nodes directly), shared causes, busy hosts -> Chain objects
  status.py     nodes, last segment, drops, clock skew

docs/fleet.md documents the dataset.
"""
