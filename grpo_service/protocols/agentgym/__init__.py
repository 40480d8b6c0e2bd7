"""AgentGym's environment-server protocol (`server`): integer ids over the service's envs."""
