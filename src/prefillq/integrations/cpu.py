"""A vLLM general plugin for CPU hosts with Intel AMX: ask the kernel for AMX tile state in every vLLM process.

Linux lets a process execute AMX tile instructions only after it has asked for them
(``arch_prctl(ARCH_REQ_XCOMP_PERM)``); the permission is inherited by forked children. vLLM 0.32's CPU
build picks its AMX attention kernel whenever the CPU has AMX and the model is bfloat16, but in the
OpenAI server's engine processes nothing asks first, so the first forward pass dies with SIGILL
("Worker proc VllmWorker-0 died unexpectedly"; seen on a Sapphire Rapids VM, 2026-12-03). vLLM runs
the ``vllm.general_plugins`` entry points in the engine process before it forks its workers (and in
a worker that was spawned instead), so :func:`enable_amx`, registered there by our package metadata,
covers them all. It does nothing where torch is absent, is not a CPU build, or the CPU has no AMX.
"""

from __future__ import annotations


def enable_amx() -> bool:
    """Request AMX tile permission for this process; True when granted (False when unavailable)."""
    try:
        import torch
    except ImportError:
        return False
    cpu = getattr(torch._C, "_cpu", None)
    try:
        if cpu is None or not torch.cpu._is_amx_tile_supported():
            return False
        return bool(cpu._init_amx())
    except Exception:  # an internal torch API moved; leave the process as it was
        return False
