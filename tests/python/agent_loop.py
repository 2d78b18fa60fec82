"""ovos-agentic-loop's ReAct engine with only the toolboxd ToolBox plugin,
found by the plugin manager's own finder, and a scripted chat engine in
place of a model (no network): it asks for the tool a turn names, then
answers with what it observed.

Usage: agent_loop.py PORT. Then one JSON turn per stdin line,
{"tool": NAME, "args": {...}}; one JSON line out per turn, after "@@ ":
{"reply": the engine's final answer, "tools": the names the plugin lists}.
The process (and its bus connection) lives across turns, so a test can
restart the daemon between two of them.
"""

import json
import sys

from ovos_agentic_loop.react import ReActLoopEngine
from ovos_plugin_manager.persona import find_toolbox_plugins
from ovos_plugin_manager.templates.agents import AgentMessage, ChatEngine, MessageRole


class ScriptedBrain(ChatEngine):
    """Asks for one tool, then gives what it observed as its final answer."""

    def __init__(self):
        super().__init__(config={})
        self.turn = {"tool": "", "args": {}}

    def continue_chat(self, messages, session_id="default", lang=None, units=None, tools=None):
        last = messages[-1].content
        if last.startswith("Observation:"):
            observed = last[len("Observation:"):].strip()
            return AgentMessage(role=MessageRole.ASSISTANT,
                                content=f"Thought: I have it.\nFINAL_ANSWER: {observed}")
        return AgentMessage(
            role=MessageRole.ASSISTANT,
            content=(f"Thought: I need {self.turn['tool']}.\nAction: {self.turn['tool']}\n"
                     f"Action Input: {json.dumps(self.turn['args'])}"))


def say(what):
    """One line for the test (OVOS logs to stdout too: ours are marked)."""
    print("@@ " + json.dumps(what), flush=True)


def main():
    port = int(sys.argv[1])
    plugins = find_toolbox_plugins()
    toolbox = plugins["toolboxd"](config={"host": "127.0.0.1", "port": port,
                                          "call_timeout": 30, "connect_timeout": 20})
    engine = ReActLoopEngine(config={"toolboxes": ["toolboxd"], "max_iterations": 3})
    engine.load_toolboxes([toolbox])
    brain = ScriptedBrain()
    engine.set_brain(brain)
    say({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        brain.turn = json.loads(line)
        # What an agent loop does at each conversation: list the tools again.
        toolbox.refresh_tools()
        reply = engine.continue_chat(
            [AgentMessage(role=MessageRole.USER, content="please use a tool")])
        say({"reply": reply.content, "tools": sorted(toolbox.tools)})
    toolbox.shutdown()


if __name__ == "__main__":
    main()
