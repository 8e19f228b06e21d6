"""Sharding inside an op: which parameters a tensor-parallel group splits, and along which axis.

The rewrite that builds a rank's graph from a layout is `passes/rewrite/tensor_shard.py`; this
package chooses the layout (`choose.py`) over parameter classes (`classes.py`), as the hybrid
search asks for one per tensor-parallel degree.
"""
