"""The openai provider offers tether's tools with the MCP server's schemas and texts."""

from __future__ import annotations

import json

from tether.providers.openai import BASH_PARAMETERS, tool_schemas
from tether.tools.mcp import DESCRIPTIONS, describe


def test_every_parameter_is_described_as_over_mcp() -> None:
    tools = {tool["function"]["name"]: tool["function"] for tool in tool_schemas()}
    assert set(tools) == {"bash", *DESCRIPTIONS}
    for name, function in tools.items():
        assert "$ref" not in json.dumps(function), name
        for parameter, schema in function["parameters"].get("properties", {}).items():
            wanted = BASH_PARAMETERS[parameter] if name == "bash" else describe(name, parameter)
            assert schema["description"] == wanted, (name, parameter)
    assert tools["thread_send"]["parameters"]["properties"]["mode"]["enum"] == ["auto", "queue"]
