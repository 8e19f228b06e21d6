"""Backends: reports (plan JSON, trace, Gantt) and executables built from a placed graph."""
