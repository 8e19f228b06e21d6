"""Plans and their meaning: the plan, the simulator, the one plan validator, memory over time, bounds, reports."""
