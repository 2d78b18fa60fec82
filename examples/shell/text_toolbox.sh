#!/usr/bin/env bash
# A text toolbox in bash + jq: MCP stdio, legacy era (initialize handshake).
# One JSON-RPC message per line on stdin; one answer per line on stdout.
set -u

TOOLS='[
  {"name": "shout", "description": "Upper-case a text.",
   "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
   "outputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
  {"name": "word_count", "description": "Count the words in a text.",
   "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
   "outputSchema": {"type": "object", "properties": {"words": {"type": "integer"}}, "required": ["words"]}}
]'

reply() { jq -cn --argjson id "$1" --argjson result "$2" '{jsonrpc: "2.0", id: $id, result: $result}'; }
fail()  { jq -cn --argjson id "$1" --arg msg "$3" --argjson code "$2" '{jsonrpc: "2.0", id: $id, error: {code: $code, message: $msg}}'; }
structured() { reply "$1" "$(jq -cn --argjson out "$2" '{content: [{type: "text", text: ($out | tojson)}], structuredContent: $out}')"; }

while IFS= read -r line; do
  id=$(jq -c '.id // empty' <<<"$line" 2>/dev/null) || continue
  [ -z "$id" ] && continue                      # a notification: nothing to answer
  method=$(jq -r '.method // empty' <<<"$line")
  case "$method" in
    initialize)
      reply "$id" "$(jq -cn --arg v "$(jq -r '.params.protocolVersion' <<<"$line")" \
        '{protocolVersion: (if $v == "2024-11-05" then $v else "2025-06-18" end),
          capabilities: {tools: {}}, serverInfo: {name: "text", version: "0.1.0"}}')" ;;
    ping)       reply "$id" '{}' ;;
    tools/list) reply "$id" "{\"tools\": $TOOLS}" ;;
    tools/call)
      name=$(jq -r '.params.name' <<<"$line")
      text=$(jq -r '.params.arguments.text // ""' <<<"$line")
      case "$name" in
        shout)      structured "$id" "$(jq -cn --arg t "$text" '{text: ($t | ascii_upcase)}')" ;;
        word_count) structured "$id" "{\"words\": $(wc -w <<<"$text")}" ;;
        *)          fail "$id" -32602 "Unknown tool: $name" ;;
      esac ;;
    *) fail "$id" -32601 "method not found: $method" ;;   # server/discover too: legacy only
  esac
done
