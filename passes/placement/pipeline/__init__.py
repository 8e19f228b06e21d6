"""Pipelines of micro-batches: the fixed schedules (GPipe, 1F1B) and their stage-level model."""
