"""Measuring policies on real servers: an absolute-time streaming load generator, the paired
protocol of SPEC §6 (warm-ups, rounds in a balanced order, disturbed-round exclusion, paired intervals),
server launching, and a mock OpenAI-compatible server for testing.

Nothing heavy is imported here. :mod:`~prefillq.bench.client` sends and measures,
:mod:`~prefillq.bench.run` runs the rounds, :mod:`~prefillq.bench.results` reads and writes the
results folder, :mod:`~prefillq.bench.analysis` turns runs into numbers (pure functions),
:mod:`~prefillq.bench.launch` starts servers, :mod:`~prefillq.bench.payload` builds request bodies and
:mod:`~prefillq.bench.mockserver` stands in for an engine.
"""
