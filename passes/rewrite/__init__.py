"""Graph rewrites the passes and searches share: re-batching, sharded state, replicas, buckets, coarse graphs."""
