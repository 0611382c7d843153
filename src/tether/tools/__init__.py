"""The agent tool surface (SPEC §5): one implementation for providers, the API and MCP."""
