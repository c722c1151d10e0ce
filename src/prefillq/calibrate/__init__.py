"""``prefillq calibrate``: fit the simulator's cost model to a real vLLM engine's step latencies.

* :mod:`~prefillq.calibrate.design`: the workload, phase by phase (pure Python);
* :mod:`~prefillq.calibrate.fit`: step samples, the non-negative least-squares fit and the profile file
  (numpy only);
* :mod:`~prefillq.calibrate.probe`: runs the design through vLLM and times each step. It imports vLLM,
  so it is not imported here: ``from prefillq.calibrate.probe import measure``.
"""

from prefillq.calibrate.design import Phase, design_phases, design_rounds, model_vocab_size
from prefillq.calibrate.fit import (
    ASSUMED_LINK_BYTES_PER_S,
    COEFFICIENT_NAMES,
    FitResult,
    StepSample,
    batch_key,
    build_profile,
    fit_cost_model,
    gpu_step_samples,
    lower_envelope,
    nnls,
    predict,
    read_samples,
    step_features,
    steps_from_log,
    write_profile,
    write_samples,
)

__all__ = ["ASSUMED_LINK_BYTES_PER_S", "COEFFICIENT_NAMES", "FitResult", "Phase", "StepSample", "batch_key",
           "build_profile", "design_phases", "design_rounds", "fit_cost_model", "gpu_step_samples", "lower_envelope",
           "model_vocab_size", "nnls", "predict", "read_samples", "step_features", "steps_from_log",
           "write_profile", "write_samples"]
