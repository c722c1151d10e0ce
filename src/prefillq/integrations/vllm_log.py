"""A vLLM general plugin: drop vLLM's start-up warning about custom scheduler classes for ours.

vLLM's ``SchedulerConfig.get_scheduler_cls()`` warns once about any scheduler class outside vLLM that
a user who "subclassed Scheduler instead of AsyncScheduler" loses async scheduling. Ours builds itself
on vLLM's ``AsyncScheduler`` whenever async scheduling is on (:mod:`prefillq.integrations.vllm`), so
for our class that warning is wrong; the scheduler logs what it actually runs on instead. vLLM runs the
``vllm.general_plugins`` entry points in the engine process before it picks the scheduler class, and
:func:`quiet_scheduler_warning` is registered there by our package metadata. It imports nothing from
vLLM and leaves every other record, and the warning for any other class, untouched.
"""

from __future__ import annotations

import logging

VLLM_SCHEDULER_LOGGER = "vllm.config.scheduler"
WARNING_START = "Using custom scheduler class"
OUR_PACKAGE = "prefillq."


def _names_our_class(value: object) -> bool:
    if isinstance(value, str):
        return value.startswith(OUR_PACKAGE)
    return str(getattr(value, "__module__", "")).startswith(OUR_PACKAGE)


class _OurSchedulerWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(WARNING_START):
            return True
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        return not (args and _names_our_class(args[0]))


def quiet_scheduler_warning() -> None:
    """Install the filter on vLLM's scheduler-config logger (idempotent)."""
    target = logging.getLogger(VLLM_SCHEDULER_LOGGER)
    if not any(isinstance(f, _OurSchedulerWarning) for f in target.filters):
        target.addFilter(_OurSchedulerWarning())
