"""In-process side: journal writer, hooks, NVRx adapters and the reference FSDP job.

Importing this package imports nothing heavy; torch and NVRx are imported by the modules that need them.
"""
