"""In-process side: what a training process imports. Its top-level modules are the supported surface.

``hooks`` (steps, saves, restores, user spans), ``saves`` (a save's span and the waits on it),
``journal`` (the writer), ``cuda_timing`` (steps timed by CUDA events), ``inprocess_callbacks`` (NVRx
``inprocess.Wrapper`` journaled), ``ft_launcher`` (``nvrx-slo ft-launcher``) and ``nvrx_compat`` (the
NVRx features those two use, detected). The names a script needs are re-exported by ``nvrx_slo``.
``reference/`` is the reference FSDP job and the demo, example code that nothing here imports.

Importing this package imports nothing heavy; torch and NVRx are imported by the modules that need them.
"""
