"""Parse and print a generated 100k-op `.pir` graph; goal: parse + print <= 5 s on 2 cores.

    python3 bench/bench_text.py [--ops 100000]
"""

from __future__ import annotations

import argparse
import random
import time

from pesto_ir import Graph, TensorType, parse
from pesto_ir.ir.attributes import BytesAttr, DurationAttr


def generated_graph(n_ops: int, seed: int = 0) -> Graph:
    """A layered graph of typical ops: matmuls, elementwise ops and costs, 1-3 operands each."""
    rng = random.Random(seed)
    g = Graph("generated")
    t = TensorType("f32", (128, 128))
    values = [g.add_input(f"in{i}", t, param=i % 2 == 0) for i in range(8)]
    for i in range(n_ops):
        k = rng.randint(1, 2)
        operands = [values[-rng.randint(1, min(len(values), 50))] for _ in range(k)]
        if k == 2 and rng.random() < 0.3:
            op = g.add_op("dot_general", operands, [t], {"dimension_numbers": [[[1], [0]], [[], []]]},
                          name=f"v{i}")
        else:
            op = g.add_op("add" if k == 2 else "tanh", operands, [t], name=f"v{i}")
        op.attrs["cost"] = DurationAttr(rng.randint(1, 999) * 1e-6)
        op.attrs["memory"] = BytesAttr(t.nbytes)
        values.append(op.result)
    g.set_outputs(values[-4:])
    return g


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ops", type=int, default=100_000)
    args = ap.parse_args()
    g = generated_graph(args.ops)
    t0 = time.perf_counter()
    text = str(g)
    t1 = time.perf_counter()
    g2 = parse(text)
    t2 = time.perf_counter()
    assert str(g2) == text
    print("| ops | bytes | print (s) | parse (s) | parse + print (s) | goal (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.ops} | {len(text)} | {t1 - t0:.2f} | {t2 - t1:.2f} | {t2 - t0:.2f} | 5.00 |")


if __name__ == "__main__":
    main()
