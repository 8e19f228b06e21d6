"""`--plan-json`: the plan as a `pesto-plan/1` document (the contract in docs/contracts.md)."""

from __future__ import annotations

import json

from pesto_ir.schedule.plan import Plan


def plan_json_text(plan: Plan) -> str:
    """The `pesto-plan/1` JSON text of `plan`, indented, ending in a newline."""
    return json.dumps(plan.to_json(), indent=2, allow_nan=False) + "\n"
