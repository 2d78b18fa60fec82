#!/usr/bin/env bash
# {{NAME}}: an MCP stdio toolbox for toolboxd in bash + jq (legacy MCP era).
# Add a tool: describe it in TOOLS, answer it in the tools/call case.
# Test it with: toolboxd check --probe --manifests <dir of {{NAME}}.toml>
set -u

TOOLS='[
  {"name": "hello", "description": "Greet someone by name.",
   "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
   "outputSchema": {"type": "object", "properties": {"greeting": {"type": "string"}}, "required": ["greeting"]}}
]'

reply() { jq -cn --argjson id "$1" --argjson result "$2" '{jsonrpc: "2.0", id: $id, result: $result}'; }
fail()  { jq -cn --argjson id "$1" --argjson code "$2" --arg msg "$3" '{jsonrpc: "2.0", id: $id, error: {code: $code, message: $msg}}'; }
tool_error() { reply "$1" "$(jq -cn --arg t "$2" '{content: [{type: "text", text: $t}], isError: true}')"; }
structured() { reply "$1" "$(jq -cn --argjson out "$2" '{content: [{type: "text", text: ($out | tojson)}], structuredContent: $out}')"; }

while IFS= read -r line; do
  id=$(jq -c '.id // empty' <<<"$line" 2>/dev/null) || continue
  [ -z "$id" ] && continue                      # a notification: nothing to answer
  case "$(jq -r '.method' <<<"$line")" in
    initialize) reply "$id" '{"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "{{NAME}}", "version": "0.1.0"}}' ;;
    ping)       reply "$id" '{}' ;;
    tools/list) reply "$id" "{\"tools\": $TOOLS}" ;;
    tools/call)
      case "$(jq -r '.params.name' <<<"$line")" in
        hello)
          name=$(jq -r '.params.arguments.name' <<<"$line")
          if [ -z "${name// }" ]; then tool_error "$id" "ValueError: name must not be blank"
          else structured "$id" "$(jq -cn --arg n "$name" '{greeting: "Hello, \($n)!"}')"; fi ;;
        *) fail "$id" -32602 "Unknown tool" ;;
      esac ;;
    *) fail "$id" -32601 "method not found" ;;   # server/discover too: this toolbox is legacy
  esac
done
