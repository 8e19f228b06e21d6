"""One file per pass. Importing this package registers the built-in passes with the pass manager;
`PASSES` (the pass manager's registry) maps each pipeline name to its pass class."""

from pesto_ir.passes.annotate_costs import AnnotateCostsPass
from pesto_ir.passes.coarsen import CoarsenPass
from pesto_ir.passes.dce import DcePass
from pesto_ir.passes.expand import ExpandPass
from pesto_ir.passes.microbatch import MicrobatchPass
from pesto_ir.passes.place import PlacePass
from pesto_ir.passes.simulate import SimulatePass
from pesto_ir.passes.verify import VerifyPass
from pesto_ir.passmanager import PASS_REGISTRY, Pass, register_pass

for _cls in (VerifyPass, DcePass, AnnotateCostsPass, SimulatePass, CoarsenPass, MicrobatchPass, PlacePass,
             ExpandPass):
    register_pass(_cls)
del _cls

# The pass manager's registry itself (one dict: adding a pass here makes pipelines able to name it).
PASSES: dict[str, type[Pass]] = PASS_REGISTRY

__all__ = ["PASSES"]
