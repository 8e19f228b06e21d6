"""One file per pass. `PASSES` maps each pipeline name to its pass class."""

from pesto_ir.passes.annotate_costs import AnnotateCostsPass
from pesto_ir.passes.simulate import SimulatePass
from pesto_ir.passes.verify import VerifyPass

from pesto_ir.passmanager import Pass

PASSES: dict[str, type[Pass]] = {p.name: p for p in (VerifyPass, AnnotateCostsPass, SimulatePass)}

__all__ = ["PASSES"]
