"""nvrx-slo: goodput accounting and SLO enforcement for NVRx FSDP training jobs."""
