"""The skill on ovos-workshop's own skill class and a FakeBus: toolboxd's
question arrives as ``ovos.tools.ask``, the person's speech is scripted in
place of the microphone (``get_response``; what the skill says is recorded
in place of the speaker), and its answer is read off the bus. Yes/no and
option matching run as in a real skill (ovos-workshop's solvers). Run by
tests/agents.rs with ``python -m unittest discover``."""

import time
import unittest

from ovos_bus_client.message import Message
from ovos_utils.fakebus import FakeBus

from ovos_skill_toolboxd_ask import ToolboxdAskSkill, askable_field


class Voice:
    """A skill on a FakeBus with a scripted person: ``heard`` is what they
    say to each question in turn (then nothing: silence)."""

    def __init__(self, heard):
        self.bus = FakeBus()
        self.skill = ToolboxdAskSkill(skill_id="ovos-skill-toolboxd-ask.test", bus=self.bus)
        self.heard = list(heard)
        self.spoken = []
        self.answers = []

        def get_response(dialog="", data=None, validator=None, on_fail=None, num_retries=-1):
            self.spoken.append(dialog)
            return self.heard.pop(0) if self.heard else None

        self.skill.get_response = get_response
        self.skill.speak = lambda utterance, *args, **kwargs: self.spoken.append(utterance)
        self.bus.on("ovos.tools.ask.response", self.answers.append)

    def ask(self, data, session="s-1", within=10.0):
        """Puts a question on the bus; the skill's answer (a Message), or
        None after ``within`` seconds."""
        before = len(self.answers)
        self.bus.emit(Message("ovos.tools.ask", data, {"session": {"session_id": session}}))
        deadline = time.monotonic() + within
        while len(self.answers) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.answers[-1] if self.answers[before:] else None


def confirm(ask_id="a1"):
    return {"ask_id": ask_id, "kind": "confirm", "toolbox_id": "home", "name": "unlock_door",
            "prompt": "May I run Unlock the front door from home?"}


def elicit(schema, ask_id="e1"):
    return {"ask_id": ask_id, "kind": "elicit", "toolbox_id": "party", "name": "plan",
            "prompt": "Who should I invite?", "schema": schema}


ONE_OF_THREE = {"type": "object", "properties": {
    "friend": {"type": "string", "enum": ["Monica", "Rachel", "Joey"]}}, "required": ["friend"]}


class ConfirmTest(unittest.TestCase):
    def test_yes_approves_and_the_answer_goes_back_to_the_asking_session(self):
        voice = Voice(["yes please"])
        answer = voice.ask(confirm("id-yes"), session="kitchen")
        self.assertEqual(answer.msg_type, "ovos.tools.ask.response")
        self.assertEqual(answer.data, {"ask_id": "id-yes", "action": "accept"})
        self.assertEqual(answer.context["session"]["session_id"], "kitchen")
        self.assertIn("May I run Unlock the front door from home?", voice.spoken)

    def test_no_declines(self):
        self.assertEqual(Voice(["no"]).ask(confirm()).data["action"], "decline")

    def test_anything_but_a_yes_declines(self):
        self.assertEqual(Voice(["purple elephants"]).ask(confirm()).data["action"], "decline")

    def test_silence_cancels(self):
        self.assertEqual(Voice([]).ask(confirm()).data["action"], "cancel")

    def test_a_question_without_an_id_is_not_answered(self):
        voice = Voice(["yes"])
        self.assertIsNone(voice.ask({"kind": "confirm", "prompt": "?"}, within=0.5))
        self.assertEqual(voice.heard, ["yes"], "nobody was asked")


class ElicitTest(unittest.TestCase):
    def test_an_enum_is_chosen_from_its_values(self):
        voice = Voice(["rachel"])
        answer = voice.ask(elicit(ONE_OF_THREE))
        self.assertEqual(answer.data["action"], "accept")
        self.assertEqual(answer.data["content"], {"friend": "Rachel"})
        self.assertTrue(any("Monica" in s and "Joey" in s for s in voice.spoken), voice.spoken)

    def test_a_number_a_boolean_and_a_string(self):
        number = {"type": "object", "properties": {"guests": {"type": "integer"}}}
        self.assertEqual(Voice(["seven"]).ask(elicit(number)).data["content"], {"guests": 7})
        self.assertEqual(Voice(["about 12"]).ask(elicit(number)).data["content"], {"guests": 12})
        self.assertEqual(Voice(["nobody knows"]).ask(elicit(number)).data["action"], "decline")
        boolean = {"type": "object", "properties": {"vegan": {"type": "boolean"}}}
        self.assertEqual(Voice(["yes"]).ask(elicit(boolean)).data["content"], {"vegan": True})
        self.assertEqual(Voice(["no"]).ask(elicit(boolean)).data["content"], {"vegan": False})
        text = {"type": "object", "properties": {"theme": {"type": "string"}, "note": {"type": "string"}},
                "required": ["theme"]}
        self.assertEqual(Voice(["pirates"]).ask(elicit(text)).data["content"], {"theme": "pirates"})

    def test_silence_cancels(self):
        self.assertEqual(Voice([]).ask(elicit(ONE_OF_THREE)).data["action"], "cancel")

    def test_an_unaskable_schema_is_declined_with_a_reason(self):
        voice = Voice(["anything"])
        two = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
               "required": ["a", "b"]}
        answer = voice.ask(elicit(two))
        self.assertEqual(answer.data["action"], "decline")
        self.assertIn("a voice asks for one", answer.data["reason"])
        self.assertIn("I can't ask that by voice.", voice.spoken)
        self.assertEqual(voice.heard, ["anything"], "nobody was asked")

    def test_which_field_is_asked(self):
        self.assertEqual(askable_field(ONE_OF_THREE)[0], "friend")
        listed = {"type": "object", "properties": {"x": {"oneOf": [{"const": "a"}, {"const": "b"}]}}}
        self.assertEqual(askable_field(listed)[0], "x")
        for schema in [{"type": "string"}, {"type": "object", "properties": {}},
                       {"type": "object", "properties": {"l": {"type": "array"}}}]:
            self.assertIsInstance(askable_field(schema), str, schema)


if __name__ == "__main__":
    unittest.main()
