"""The plugin alone: JSON Schemas made models, and the errors it gives when
the bus or the daemon is away (run by tests/agents.rs with
`python -m unittest discover python/ovos-toolboxd/tests`; $TOOLBOXD_TEST_NO_BUS
is a loopback port nothing listens on, $TOOLBOXD_TEST_BARE_BUS one where a
bus runs with no tool service on it)."""

import os
import time
import unittest
from typing import get_args

from pydantic import ValidationError

from ovos_toolboxd import ToolboxdError, ToolboxdToolBox
from ovos_toolboxd.schemas import model_of


class SchemasTest(unittest.TestCase):
    def test_properties_required_and_defaults(self):
        model = model_of({"type": "object",
                          "properties": {"a": {"type": "integer"},
                                         "b": {"type": "integer", "default": 7},
                                         "c": {"type": "string", "description": "the c"}},
                          "required": ["a"]}, "add")
        self.assertEqual(model(a=2).model_dump(), {"a": 2, "b": 7, "c": None})
        with self.assertRaises(ValidationError):
            model(b=1)
        with self.assertRaises(ValidationError):
            model(a="two")
        self.assertEqual(model.model_fields["c"].description, "the c")

    def test_enums_nested_objects_and_arrays(self):
        model = model_of({"type": "object", "properties": {
            "unit": {"enum": ["c", "f"]},
            "where": {"type": "object", "properties": {"city": {"type": "string"}},
                      "required": ["city"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "scores": {"type": "object", "additionalProperties": {"type": "number"}},
        }, "required": ["unit", "where"]}, "weather")
        value = model(unit="c", where={"city": "Porto"}, tags=["x"], scores={"a": 1.5})
        self.assertEqual(value.where.city, "Porto")
        self.assertEqual(value.tags, ["x"])
        for bad in ({"unit": "k", "where": {"city": "Porto"}},
                    {"unit": "c", "where": {}},
                    {"unit": "c", "where": {"city": "Porto"}, "tags": [1, {}]}):
            with self.assertRaises(ValidationError, msg=bad):
                model(**bad)

    def test_any_of_nullable_and_refs(self):
        model = model_of({"type": "object", "$defs": {"Point": {
            "type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
            "properties": {
                "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "either": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
                "listed": {"type": ["string", "null"]},
                "point": {"$ref": "#/$defs/Point"},
            }, "required": ["maybe", "point"]}, "mixed")
        value = model(maybe=None, either=True, listed=None, point={"x": 1})
        self.assertIsNone(value.maybe)
        self.assertEqual(value.point.x, 1)
        self.assertIn(type(None), get_args(model.model_fields["maybe"].annotation))
        with self.assertRaises(ValidationError):
            model(maybe=None, point={})

    def test_what_no_model_states_is_kept(self):
        model = model_of({"type": "object", "properties": {"a": {"type": "integer"}}}, "open")
        self.assertEqual(model(a=1, extra="kept").model_dump(), {"a": 1, "extra": "kept"})


class AwayTest(unittest.TestCase):
    def test_no_bus_says_so_within_its_bound(self):
        port = int(os.environ["TOOLBOXD_TEST_NO_BUS"])
        started = time.monotonic()
        toolbox = ToolboxdToolBox(config={"host": "127.0.0.1", "port": port,
                                          "connect_timeout": 1})
        self.assertEqual(toolbox.tools, {})
        with self.assertRaises(ToolboxdError) as raised:
            toolbox.call_tool("add", {"a": 1, "b": 2})
        self.assertIn(f"not connected to the messagebus at ws://127.0.0.1:{port}/core",
                      str(raised.exception))
        self.assertLess(time.monotonic() - started, 10)
        toolbox.shutdown()

    def test_a_bus_without_toolboxd_says_so_within_its_bound(self):
        port = int(os.environ["TOOLBOXD_TEST_BARE_BUS"])
        toolbox = ToolboxdToolBox(config={"host": "127.0.0.1", "port": port,
                                          "list_timeout": 1, "connect_timeout": 5})
        with self.assertRaises(ToolboxdError) as raised:
            toolbox.discover_tools()
        self.assertIn("no answer to ovos.tools.list within 1 s", str(raised.exception))
        self.assertIn("is toolboxd", str(raised.exception))
        toolbox.shutdown()


if __name__ == "__main__":
    unittest.main()
