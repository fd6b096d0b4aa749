"""Prometheus metrics of a running trace (`ingero trace --metrics-port`)."""
