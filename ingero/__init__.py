"""ingero: why is my GPU job slow?  eBPF tracing of CUDA calls and host events."""

__version__ = "0.1.0"
