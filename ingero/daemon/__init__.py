"""Running `ingero trace` for days: query server on a Unix socket (server, client, protocol,
sqlguard), status (state), retention, write faults, and the Daemon the trace session drives
(runtime).  synthetic.py is a BPF-free writer for tests and measurements."""
