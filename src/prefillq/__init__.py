"""prefillq: prefill-queue scheduling policies for LLM serving engines.

The public API::

    from prefillq import QueuedRequest, make_queue, load_config, order, ConfigError
"""

from prefillq.config import ConfigError, PolicyConfig, load_config
from prefillq.policies import PolicyQueue, Ranker, make_queue, order
from prefillq.requests import QueuedRequest

__version__ = "0.1.0"

__all__ = ["ConfigError", "PolicyConfig", "PolicyQueue", "QueuedRequest", "Ranker", "load_config",
           "make_queue", "order"]
