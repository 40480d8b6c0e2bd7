"""The live objects behind every surface: the registry of envs, policies and runs (`registry`),
signed snapshots (`snapshots`), the env and policy managers that create, step, copy and discard
them (`env_manager`, `policy_manager`, over `live_objects`), and branching (`branching`)."""
