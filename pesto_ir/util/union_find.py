"""Union-find (disjoint sets) over a parent map: the root lookup every union-find here shares.

The parent map is a list over indices or a dict over any keys; a root is its own parent. Each
caller keeps its own union rule (which root survives, what a class carries along).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

K = TypeVar("K")


class ParentMap(Protocol[K]):
    """A list or dict from each element to its parent."""

    def __getitem__(self, key: K, /) -> K: ...

    def __setitem__(self, key: K, value: K, /) -> None: ...


def find_root(parent: ParentMap[K], x: K) -> K:
    """The root of `x`'s set, halving the path on the way (each element passed now points to its
    grandparent)."""
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x
