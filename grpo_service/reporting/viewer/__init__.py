"""The trace viewer: run list, rollout replay and group view over a trace DB.

`queries` reads the DB (read-only), `replay` replays a rollout through its environment for frames,
`static/` is the page (plain HTML, CSS and JS, no build step). The HTTP routes are in
`grpo_service.api.routes.viewer`; ``grpo-service view`` serves them alone over any trace DB.
"""
