"""Answers toolboxd's questions by voice (``ovos.tools.ask``; toolboxd's
docs/protocol.md, "Asking the person"): a yes or no before a tool with side
effects runs, and the single field a toolbox asks the person for."""

import re
from typing import Optional, Tuple, Union

from ovos_bus_client.message import Message
from ovos_workshop.skills import OVOSSkill

try:
    from ovos_number_parser import extract_number
except ImportError:  # an older install: digits only
    extract_number = None

ASK = "ovos.tools.ask"
#: The longest prompt spoken (toolboxd sends at most 300 characters).
MAX_PROMPT = 300
#: Field types a voice can ask for.
SPOKEN_TYPES = ("string", "number", "integer", "boolean")

Field = Tuple[str, dict]


def askable_field(schema) -> Union[Field, str]:
    """The one field of ``schema`` a voice can ask for, as (name, its
    schema); or why there is none."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "it is not an object schema"
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return "it asks for no field"
    required = [r for r in schema.get("required") or [] if r in properties]
    if len(properties) == 1:
        name = next(iter(properties))
    elif len(required) == 1:
        name = required[0]
    else:
        return (f"it asks for {len(required) or len(properties)} fields; "
                "a voice asks for one")
    spec = properties[name]
    if not isinstance(spec, dict):
        return f"the field {name!r} has no schema"
    if choices_of(spec) is None and spec.get("type") not in SPOKEN_TYPES:
        return f"the field {name!r} is a {spec.get('type', 'value of no type')}, which a voice cannot give"
    return name, spec


def choices_of(spec: dict) -> Optional[list]:
    """The values a field may take, when it lists them (``enum``, or a
    ``oneOf`` of ``const``s)."""
    if isinstance(spec.get("enum"), list) and spec["enum"]:
        return list(spec["enum"])
    one_of = spec.get("oneOf")
    if isinstance(one_of, list) and one_of and all(isinstance(o, dict) and "const" in o for o in one_of):
        return [o["const"] for o in one_of]
    return None


class ToolboxdAskSkill(OVOSSkill):
    """Speaks toolboxd's question to the person who made the call (the
    question carries their session) and answers with what they said."""

    def initialize(self):
        self.add_event(ASK, self.handle_ask)

    def handle_ask(self, message: Message):
        data = message.data or {}
        ask_id = data.get("ask_id")
        if not isinstance(ask_id, str):
            return
        prompt = str(data.get("prompt") or "")[:MAX_PROMPT]
        kind = data.get("kind")
        if kind == "confirm":
            answer = self.confirm(prompt)
        elif kind == "elicit":
            answer = self.elicit(prompt, data.get("schema"))
        else:
            answer = {"action": "decline", "reason": f"a question of kind {kind!r} is unknown here"}
        answer["ask_id"] = ask_id
        self.bus.emit(message.response(answer))

    def confirm(self, prompt: str) -> dict:
        """Yes approves; no, or anything that is not a yes, declines;
        silence cancels."""
        said = self.ask_yesno(prompt)
        if said == "yes":
            return {"action": "accept"}
        if said is None:
            return {"action": "cancel"}
        return {"action": "decline"}

    def elicit(self, prompt: str, schema) -> dict:
        """Asks for the one field of ``schema``; its value, as the schema
        types it."""
        field = askable_field(schema)
        if isinstance(field, str):
            self.speak("I can't ask that by voice.")
            return {"action": "decline", "reason": f"this question cannot be asked by voice: {field}"}
        name, spec = field
        label = spec.get("title") or spec.get("description") or ""
        question = f"{prompt} {label}".strip() if label and label not in prompt else prompt
        choices = choices_of(spec)
        if choices is not None:
            spoken = [str(c) for c in choices]
            chosen = self.ask_selection(spoken, question)
            if chosen is None:
                return {"action": "cancel"}
            return {"action": "accept", "content": {name: choices[spoken.index(chosen)]}}
        kind = spec.get("type")
        if kind == "boolean":
            said = self.ask_yesno(question)
            if said is None:
                return {"action": "cancel"}
            if said not in ("yes", "no"):
                return {"action": "decline", "reason": "the answer was neither yes nor no"}
            return {"action": "accept", "content": {name: said == "yes"}}
        heard = self.get_response(question)
        if heard is None:
            return {"action": "cancel"}
        if kind == "string":
            return {"action": "accept", "content": {name: heard}}
        number = self.number_in(heard)
        if number is None:
            return {"action": "decline", "reason": f"no number was heard in {heard!r}"}
        if kind == "integer":
            if number != int(number):
                return {"action": "decline", "reason": f"{number} is not a whole number"}
            number = int(number)
        return {"action": "accept", "content": {name: number}}

    def number_in(self, heard: str) -> Optional[float]:
        """The number said in ``heard`` ("seven", "7.5"), if there is one."""
        if extract_number is not None:
            found = extract_number(heard, lang=self.lang)
            if found is not False and found is not None:
                return found
        digits = re.search(r"-?\d+(?:\.\d+)?", heard)
        return float(digits.group()) if digits else None
