"""HTTP routers. Thin: parse, authorize, call a service object, shape the response."""
