"""Measuring policies on real servers: an absolute-time streaming load generator, the paired
protocol of SPEC §6 (warm-ups, rotated rounds, disturbed-round exclusion, bootstrap intervals),
server launching, and a mock OpenAI-compatible server for testing.

Nothing heavy is imported here; see :mod:`prefillq.bench.client`, :mod:`prefillq.bench.protocol`,
:mod:`prefillq.bench.launch`, :mod:`prefillq.bench.payload` and :mod:`prefillq.bench.mockserver`.
"""
