"""The operator's standing commands for a model (drain, restart) as a value, and their rules.

Owns: ``ModelCommand`` (one per model, stored by ``llmgw.control.commands`` in Consul KV at
``llmgw/commands/<model slug>``) and how a drain and a restart change it. The planner
reads it through ``Desired.commands``:

- a drain holds while the model's catalog entry is the one it was drained under
  (``drained_key`` equals ``ModelTarget.key``): the model is wanted at 0 replicas. An apply
  that changes the model ends it (the planner asks for the record to be cleared, so a
  later apply back to the drained text does not drain the model again), and so does a
  restart;
- a restart raises ``restart_generation``. Every replica is placed with the generation
  of its time (job meta ``llmgw_restart_generation``); one with a lower generation is
  outdated and rolls like a replica of an old spec: a new one healthy before an old one
  drains, one at a time.

Must not: do I/O or read a clock (the caller passes ``at``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class ModelCommand:
    model: str
    # Raised by every restart; replicas placed under a lower one are replaced.
    restart_generation: int = 0
    restarted_by: str = ""
    restarted_at: float = 0.0
    # The model's catalog key (``desired.model_key``) when it was drained; "" when it is not.
    drained_key: str = ""
    drained_by: str = ""
    drained_at: float = 0.0

    @property
    def drain_requested(self) -> bool:
        return bool(self.drained_key)

    def drains(self, model_key: str) -> bool:
        """Does the drain hold for the model as the catalog has it now?"""
        return bool(self.drained_key) and self.drained_key == model_key

    def drained(self, *, model_key: str, by: str, at: float) -> ModelCommand:
        return replace(self, drained_key=model_key, drained_by=by, drained_at=at)

    def restarted(self, *, by: str, at: float) -> ModelCommand:
        """One generation more, and no drain."""
        return replace(
            self.drain_ended(),
            restart_generation=self.restart_generation + 1,
            restarted_by=by,
            restarted_at=at,
        )

    def drain_ended(self) -> ModelCommand:
        return replace(self, drained_key="", drained_by="", drained_at=0.0)
