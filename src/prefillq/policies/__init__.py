"""The prefill-queue policies: the contract (``base``), one small file per policy, the registry, and
the re-ranking adapter (``ranker``) for engines that order a whole ready list every step."""

from __future__ import annotations

from prefillq.policies.base import PolicyQueue
from prefillq.policies.ranker import Ranker, order
from prefillq.policies.registry import QUEUES, make_queue
from prefillq.policies.tiers import TiersQueue

__all__ = ["QUEUES", "PolicyQueue", "Ranker", "TiersQueue", "make_queue", "order"]
