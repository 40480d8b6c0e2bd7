"""Tools around the service, never imported by serving code: the benchmark (`tools.bench`),
the vLLM-shaped fake inference server (`tools.fake_server`, with its toy tokenizer), an ASGI
server in a thread (`tools.server_thread`), synthetic trace DBs (`tools.synthetic_traces`) and
OpenEnv's own clients in a venv of their own (`tools.openenv_venv`)."""
