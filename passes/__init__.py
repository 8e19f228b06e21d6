"""One file per pass. `PASSES` maps each pipeline name to its pass class."""

from pesto_ir.passes.annotate_costs import AnnotateCostsPass
from pesto_ir.passes.coarsen import CoarsenPass
from pesto_ir.passes.dce import DcePass
from pesto_ir.passes.expand import ExpandPass
from pesto_ir.passes.microbatch import MicrobatchPass
from pesto_ir.passes.place import PlacePass
from pesto_ir.passes.simulate import SimulatePass
from pesto_ir.passes.verify import VerifyPass
from pesto_ir.passmanager import Pass

PASSES: dict[str, type[Pass]] = {
    p.name: p for p in (VerifyPass, DcePass, AnnotateCostsPass, SimulatePass, CoarsenPass, MicrobatchPass,
                        PlacePass, ExpandPass)
}

__all__ = ["PASSES"]
