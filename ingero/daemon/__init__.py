"""Running `ingero trace` for days: query server on a Unix socket (server, client, protocol,
sqlguard), status (state), retention, write faults, and the Daemon the trace session drives
(runtime).  A BPF-free writer process for tests and measurements is bench/synthetic_writer.py."""
