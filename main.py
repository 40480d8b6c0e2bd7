"""Entry point: `uvicorn main:app`, `python main.py`, and `modal deploy main.py`."""

from __future__ import annotations

from grpo_service import Settings, create_app

app = create_app()

if __name__ == "__main__":
    from grpo_service.server import serve

    serve(Settings())
