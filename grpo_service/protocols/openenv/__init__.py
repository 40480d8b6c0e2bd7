"""OpenEnv's protocol for every registered environment (`server`): the frames and schemas
(`frames`), the sessions over the service's live envs (`sessions`) and MCP's JSON-RPC (`mcp`)."""
