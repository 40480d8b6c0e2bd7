"""Serving the app: uvicorn for one process (`server`), and ``serve --workers N``: a supervisor
and its worker processes (`workers`) and the routing of requests between them (`peers`)."""
