"""Exports of a store selection: a Perfetto timeline with the causal arrows, Parquet files, an HTML report.

Every exporter reads one ``Selection`` (session, time range, processes) and
writes through ``output`` so a file is created private and complete or not at all.
"""
