"""Placement: the algorithms the `place` pass runs, their registry and what they share."""
