"""Serving through a Ray cluster (``serve --ray``): hosts (`host`), the front's view of them
(`cluster`) and the middleware that sends each request to its host (`router`). Imported only
when RAY_ADDRESS is set: the embedded server never imports Ray."""
