#!/usr/bin/env python3
"""{{NAME}}: an MCP stdio toolbox for toolboxd (standard library only).

Add a tool: write a function, describe its arguments (and, optionally, its
output) as JSON Schema, decorate it. Raise an exception to report an error:
the caller sees "ExceptionClass: message". Test it with
    toolboxd check --probe --manifests <dir of {{NAME}}.toml>
"""

from mcp_toolbox import Toolbox

box = Toolbox("{{NAME}}")


@box.tool(
    input_schema={
        "type": "object",
        "properties": {"name": {"type": "string", "description": "Who to greet"}},
        "required": ["name"],
    },
    output_schema={
        "type": "object",
        "properties": {"greeting": {"type": "string"}},
        "required": ["greeting"],
    },
)
def hello(name):
    """Greet someone by name."""
    if not name.strip():
        raise ValueError("name must not be blank")
    return {"greeting": f"Hello, {name}!"}


if __name__ == "__main__":
    box.run()
