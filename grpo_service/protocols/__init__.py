"""Other clients' wire formats over the same core: AgentGym's HTTP protocol (`agentgym`) and
OpenEnv's WebSocket and MCP protocol (`openenv`), each mounted on the app."""
