"""Searches over plans: `auto`'s portfolio, hybrid strategies, LNS, critical-path moves, start plans."""
