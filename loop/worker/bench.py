"""What the kernel process reports of its timed work beside the times (`loop.worker.serve`): the
configs a kernel tuned at run time picked. The timing itself is the judge's rounds, each sample
taken by `loop.worker.sampler`."""

from __future__ import annotations


def tuned_configs(module) -> dict[str, str]:
    """The configs a kernel tuned at run time has picked so far, by input key: the cutile-autotune
    convention (module-level `_TUNED`: key -> (config, kernel)) and Triton autotuners (`cache`:
    key -> Config). A pick made in the timing process is what was timed; another process may pick
    differently, and this makes it visible. Never raises: a record, not a check."""
    picks: dict[str, str] = {}
    try:
        tuned = getattr(module, "_TUNED", None)
        if isinstance(tuned, dict):
            for key, value in list(tuned.items()):
                picks[repr(key)[:300]] = repr(value[0] if isinstance(value, tuple) and value else value)[:300]
        for name, obj in list(vars(module).items()):
            cache = getattr(obj, "cache", None)
            if isinstance(cache, dict) and isinstance(getattr(obj, "configs", None), list):
                for key, cfg in list(cache.items()):
                    picks[f"{name}{repr(key)}"[:300]] = str(cfg)[:300]
    except Exception:  # noqa: BLE001 - an odd module attribute must not fail a measurement
        pass
    return picks
