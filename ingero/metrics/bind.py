"""Where /metrics listens: the values of --metrics-port and --metrics-addr (no prometheus_client import)."""

from __future__ import annotations

import ipaddress
from typing import Any

from ingero.values import BadValue, parse_count

DEFAULT_ADDR = "127.0.0.1"
DEFAULT_PORT = 9464  # the port the issue and deploy/prometheus.yml use


def parse_port(value: Any, what: str = "--metrics-port") -> int:
    return parse_count(value, what, minimum=1, cap=65535)


def parse_address(value: Any, what: str = "--metrics-addr") -> str:
    """An IP address to bind (v4 or v6), or 'localhost': no name lookups, whose answer could change."""
    text = str(value).strip()
    if text == "localhost":
        return text
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        raise BadValue(f"bad {what}: {value!r} is not an IP address",
                       "pass one this host has, e.g. 127.0.0.1 (the default), 0.0.0.0 or ::1") from None
