"""Heuristic placers: Baechi's m-TOPO, m-ETF and m-SCT, list schedulers, reference placements."""
