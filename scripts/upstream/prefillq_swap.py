"""pytest plugin: run vLLM's own scheduler tests with prefillq's classes in place of vLLM's.

Loaded with ``-p prefillq_swap`` before vLLM's test modules are imported, it rebinds the names those
modules import (``vllm.v1.core.sched.scheduler.Scheduler`` and ``...async_scheduler.AsyncScheduler``)
to the prefillq plug-in running the policy named by ``PREFILLQ_CONFIG`` (``default`` when unset): the
one-for-every-mode ``Scheduler``, and for code that asks for vLLM's async class explicitly, the same
class built on vLLM's ``AsyncScheduler``.
"""

from __future__ import annotations

import vllm.v1.core.sched.async_scheduler as vllm_async_scheduler
import vllm.v1.core.sched.scheduler as vllm_scheduler

from prefillq.integrations import vllm as plugin

vllm_scheduler.Scheduler = plugin.Scheduler
vllm_async_scheduler.AsyncScheduler = plugin.AsyncModeScheduler


def pytest_report_header(config):
    return f"prefillq: vLLM's scheduler classes replaced by {plugin.Scheduler.__module__}.Scheduler"
