"""Ingest: journal files to validated events (``tail``, ``decode``), and the side inputs (cycle-info
files, the Kubernetes API, NVML). Imports nothing of ``engine`` or ``views``."""
