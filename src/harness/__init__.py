"""The replica simulation harness: several production schedulers, one PostgreSQL, one frozen clock.

``Simulation`` runs explicit steps (posts, claims, dispatches, commits, crashes, kills, clock
jumps) across replicas and compares the database with an in-memory model after each one;
``driver.run_random`` drives it from a seed; ``broken.VARIANTS`` are schedulers with one
deliberate bug each, which the invariants must catch. See docs/simulation.md.
"""

from harness.broken import VARIANTS, Variant
from harness.simulation import T0, HarnessError, Simulation, Violation

__all__ = ["T0", "VARIANTS", "HarnessError", "Simulation", "Variant", "Violation"]
