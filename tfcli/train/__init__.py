"""Training: the Trainer (`trainer`) and its parts: the objective (`loss`), batches (`data`), optimisers, schedules,
the time budget, checkpoints, validation, logs and profiles."""

from tfcli import lazy

# the entry points of tools beside the library (benchmarks/: docs/architecture.md)
_NAMES = {
    "Objective": "loss",
    "Batch": "data",
    "ParallelData": "data",
    "new_profiler": "profiling",
    "op_table": "profiling",
    "gpu_peak_flops": "flops",
}
__all__ = list(_NAMES)
__getattr__ = lazy(__name__, _NAMES)
