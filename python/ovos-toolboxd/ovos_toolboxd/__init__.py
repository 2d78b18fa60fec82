"""An OVOS ToolBox plugin whose tools are the bus's: every tool the tool
service on the messagebus lists (toolboxd, supervising each toolbox in a
confined process of its own), for agent loops that load toolboxes in
process (``opm.agents.toolbox`` entry point ``toolboxd``).

The tools are listed with ``ovos.tools.list`` (again at each
``discover_tools()``) and called with ``ovos.persona.tools.call``, naming
their toolbox, so two toolboxes' tools of the same name stay apart: such a
name is listed as ``<toolbox>__<name>``, every other under its own name.
Each wait is bounded; when the bus or the daemon is away, the error says
which and what to do.

Configuration (the persona's config for this toolbox, all optional):

- ``host``, ``port``, ``route``, ``ssl``: the bus (default: mycroft.conf's);
- ``list_timeout``: seconds ``ovos.tools.list`` may take (5);
- ``call_timeout``: seconds a call may take (120; the daemon's own
  ``call_timeout_s`` answers first when shorter);
- ``connect_timeout``: seconds to wait for the bus when it is away (5).
"""

import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from ovos_bus_client import Message, MessageBusClient
from ovos_plugin_manager.templates.agent_tools import (
    AgentTool,
    ToolArguments,
    ToolBox,
    ToolOutput,
)
from pydantic import ConfigDict

from ovos_toolboxd.schemas import model_of

__all__ = ["ToolboxdToolBox", "ToolboxdError", "SOURCE", "SEPARATOR"]

#: The ``source`` of every message this plugin sends: the daemon's audit
#: log records it, so a call's face is known.
SOURCE = "toolboxd-opm"

#: Between a toolbox id and a tool name, for a name several toolboxes own.
SEPARATOR = "__"


class ToolboxdError(RuntimeError):
    """The bus or the daemon did not answer, or answered with an error."""


class _Arguments(ToolArguments):
    model_config = ConfigDict(extra="allow")


class _Output(ToolOutput):
    model_config = ConfigDict(extra="allow")


class ToolboxdToolBox(ToolBox):
    """Every tool of the bus's tool service, as one ToolBox."""

    def __init__(self, toolbox_id: str = "toolboxd",
                 config: Optional[Dict[str, Any]] = None,
                 bus: Optional[MessageBusClient] = None):
        config = config or {}
        self._own_bus: Optional[MessageBusClient] = None
        self._lock = threading.Lock()
        self.list_timeout = float(config.get("list_timeout", 5))
        self.call_timeout = float(config.get("call_timeout", 120))
        self.connect_timeout = float(config.get("connect_timeout", 5))
        #: unique name -> (toolbox id, name on the bus, bus definition)
        self._routes: Dict[str, Tuple[str, str, Dict[str, Any]]] = {}
        # The template clears `bus` before its first discovery: kept here.
        self._given_bus = bus
        super().__init__(toolbox_id, config, bus)

    # -- the bus ---------------------------------------------------------

    def bind(self, bus: MessageBusClient) -> None:
        """Uses ``bus`` for listing and calls. This toolbox only asks the
        bus: it answers no persona topic itself (toolboxd does)."""
        self.bus = bus

    def unbind(self) -> None:
        self.bus = None
        self._given_bus = None

    def _bus(self) -> MessageBusClient:
        """The bus, connected (this plugin's own client when none was bound)."""
        with self._lock:
            if self.bus is None and self._given_bus is not None:
                self.bus = self._given_bus
            if self.bus is None:
                cfg = self.config
                self._own_bus = MessageBusClient(host=cfg.get("host"), port=cfg.get("port"),
                                                 route=cfg.get("route"), ssl=cfg.get("ssl"))
                self._own_bus.run_in_thread()
                self.bus = self._own_bus
            bus = self.bus
        self._wait_connected(bus)
        return bus

    def _url(self, bus: MessageBusClient) -> str:
        conf = getattr(bus, "config", None)
        if conf is None:
            return "the bus"
        return MessageBusClient.build_url(conf.host, conf.port, conf.route, conf.ssl)

    def _wait_connected(self, bus: MessageBusClient) -> None:
        """Waits (``connect_timeout``) for the bus's connection to be up."""
        deadline = time.monotonic() + self.connect_timeout
        while True:
            client = getattr(bus, "client", None)
            sock = getattr(client, "sock", None)
            if getattr(bus, "connected_event", None) is None:
                return  # a bus without a socket (FakeBus)
            if bus.connected_event.is_set() and sock is not None and getattr(sock, "connected", False):
                return
            if time.monotonic() >= deadline:
                raise ToolboxdError(
                    f"not connected to the messagebus at {self._url(bus)} after "
                    f"{self.connect_timeout:g} s: is the bus running? (toolboxd's tools are "
                    "served there)")
            time.sleep(0.05)

    def _ask(self, message: Message, reply_type: str, timeout: float, what: str) -> Message:
        """Emits ``message`` with a session of its own and waits, at most
        ``timeout``, for its ``reply_type`` answer carrying that session."""
        bus = self._bus()
        session = f"{SOURCE}-{uuid.uuid4().hex}"
        message.context.update({"source": SOURCE, "destination": "toolboxd",
                                "session": {"session_id": session}})
        answered = threading.Event()
        box: List[Message] = []

        def on_answer(answer: Message) -> None:
            if (answer.context.get("session") or {}).get("session_id") == session:
                box.append(answer)
                answered.set()

        bus.on(reply_type, on_answer)
        try:
            bus.emit(message)
            if not answered.wait(timeout):
                raise ToolboxdError(
                    f"no answer to {what} within {timeout:g} s from the bus at "
                    f"{self._url(bus)}: is toolboxd (or another tool service) running there?")
        finally:
            bus.remove(reply_type, on_answer)
        return box[0]

    # -- the ToolBox -----------------------------------------------------

    def discover_tools(self) -> List[AgentTool]:
        """Every tool the bus's tool service lists now (``ovos.tools.list``)."""
        answer = self._ask(Message("ovos.tools.list"), "ovos.tools.list.response",
                           self.list_timeout, "ovos.tools.list")
        definitions = [t for t in answer.data.get("tools") or []
                       if isinstance(t, dict) and t.get("name") and t.get("toolbox_id")]
        owners: Dict[str, set] = {}
        for t in definitions:
            owners.setdefault(t["name"], set()).add(t["toolbox_id"])
        routes: Dict[str, Tuple[str, str, Dict[str, Any]]] = {}
        tools: List[AgentTool] = []
        for t in definitions:
            name, toolbox = t["name"], t["toolbox_id"]
            unique = f"{toolbox}{SEPARATOR}{name}" if len(owners[name]) > 1 else name
            if unique in routes:
                continue
            routes[unique] = (toolbox, name, t)
            tools.append(AgentTool(
                name=unique,
                description=t.get("description") or "",
                argument_schema=model_of(t.get("argument_schema") or {}, f"{unique} arguments",
                                         base=_Arguments),
                output_schema=model_of(t.get("output_schema") or {}, f"{unique} output",
                                       base=_Output),
                tool_call=self._caller(unique),
            ))
        self._routes = routes
        return tools

    @property
    def tool_json_list(self) -> List[Dict[str, Any]]:
        """The tools with their schemas as the bus gave them (not as the
        models would regenerate them), under their unique names."""
        return [{"name": unique,
                 "description": definition.get("description") or "",
                 "argument_schema": definition.get("argument_schema") or {"type": "object"},
                 "output_schema": definition.get("output_schema") or {"type": "object"}}
                for unique, (_, _, definition) in self._routes.items()
                if unique in self.tools]

    def _caller(self, unique: str):
        def call(arguments: ToolArguments) -> Dict[str, Any]:
            return self._call(unique, arguments)
        return call

    def _call(self, unique: str, arguments: ToolArguments) -> Dict[str, Any]:
        """One call on the bus: its result, or a :class:`ToolboxdError` with
        the daemon's error text (``Class: message``)."""
        if unique not in self._routes:
            raise ToolboxdError(f"Unknown tool '{unique}': the bus no longer lists it")
        toolbox, name, _ = self._routes[unique]
        kwargs = arguments.model_dump(mode="json", exclude_unset=True)
        message = Message("ovos.persona.tools.call",
                          {"toolbox_id": toolbox, "name": name, "kwargs": kwargs})
        answer = self._ask(message, "ovos.persona.tools.call.response", self.call_timeout,
                           f"the call of '{name}' in toolbox '{toolbox}'")
        if "error" in answer.data:
            raise ToolboxdError(str(answer.data["error"]))
        result = answer.data.get("result")
        return result if isinstance(result, dict) else {"result": result}

    def shutdown(self) -> None:
        """Closes the bus connection this plugin opened itself, if any."""
        if self._own_bus is not None:
            self._own_bus.close()
            self._own_bus = None
            self.bus = None
