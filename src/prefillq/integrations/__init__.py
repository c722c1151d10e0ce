"""Adapters to real serving engines.

``prefillq.integrations.vllm`` is the scheduler plug-in and, with ``prefillq.calibrate.probe`` (which
measures an engine running it), the only module of the package that imports vLLM; it is loaded by
vLLM itself (``--scheduler-cls prefillq.integrations.vllm.Scheduler``), never by ``import prefillq``.
The other modules here (server command, tiny test model, the Prometheus exporter ``metrics``) import
vLLM's dependencies lazily, inside the functions that need them.
"""
