#!/usr/bin/env python3
"""A CPU-bound Python toolbox for the replicas benchmark: one process can use
one core (the GIL), so `instances = 2` should use two."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "python"))
from mcp_toolbox import Toolbox  # noqa: E402

box = Toolbox("cpu")


@box.tool(input_schema={"type": "object", "properties": {"ms": {"type": "integer"}}},
          output_schema={"type": "object", "properties": {"spun_ms": {"type": "integer"}}})
def burn(ms=5):
    """Burn CPU for ms milliseconds."""
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += 1
    return {"spun_ms": ms}


if __name__ == "__main__":
    box.run()
