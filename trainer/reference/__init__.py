"""The reference FSDP job and the demo: example code, apart from the supported surface.

``job`` (``nvrx-slo train``) instruments itself through ``nvrx_slo.Hooks`` like any user's script;
what it needs beyond that is its own: its model, its checkpointer (NVRx async with CPU staging,
``nvrx_async`` for the NVRx releases, ``cpu_shims`` for a host without CUDA, ``write_stamp`` for
when a write finished), restore, fault injection, and the harness that runs it under ft_launcher
for the demo (``harness``). Nothing outside this folder but tests, benchmarks and the
``nvrx-slo train``/``demo`` commands imports it.
"""
