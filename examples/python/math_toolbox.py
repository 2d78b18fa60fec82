#!/usr/bin/env python3
"""A math toolbox: the smallest useful example of an MCP stdio toolbox."""

import time

from mcp_toolbox import Toolbox

box = Toolbox("math", page_size=2)  # page_size: tools/list answers in pages


@box.tool(
    input_schema={
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
    },
    output_schema={
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
    },
)
def add(a, b):
    """Add two integers."""
    return {"result": a + b}


@box.tool(
    input_schema={
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
)
def echo(text):
    """Return the text unchanged."""
    return text


@box.tool(
    input_schema={
        "type": "object",
        "properties": {"number": {"type": "number"}},
        "required": ["number"],
    },
    output_schema={
        "type": "object",
        "properties": {"result": {"type": "number"}},
        "required": ["result"],
    },
)
def sqrt(number):
    """Square root of a non-negative number."""
    if number < 0:
        raise ValueError(f"cannot take the square root of {number}")
    return {"result": number ** 0.5}


@box.tool(
    input_schema={
        "type": "object",
        "properties": {"seconds": {"type": "number", "minimum": 0, "maximum": 60}},
        "required": ["seconds"],
    },
    output_schema={
        "type": "object",
        "properties": {"slept": {"type": "number"}},
        "required": ["slept"],
    },
)
def sleep(seconds):
    """Wait, then answer: for trying out concurrency and timeouts."""
    time.sleep(seconds)
    return {"slept": seconds}


if __name__ == "__main__":
    box.run()
