"""The end-to-end suite's fixtures, as pytest plugins (conftest.py loads
them with `pytest_plugins`): each module starts one kind of server for the
tests that ask for it by name, and stops it after them.

- envoy: Envoy for either host (`start_envoy`), the recording `upstream`,
  an alert `receiver`; Envoy's logs when a test fails.
- redis: Redis and webdis (`backend`, `shared`, `own_backend`), and the
  check that their servers are installed.
- cluster: a Redis Cluster behind redis_proxy and webdis (`cluster`,
  `fresh_cluster`, `own_cluster`).
- mcp: the MCP apps' server (`mcp_server`, `mcp_servers`).
- providers: fake LLM providers (`provider`, `stuck`, `streams`).

A fixture a single test file needs alone stays in that file; the servers
themselves are in the helper modules (harness, shared_store, redis_cluster,
mcp_agents, llm_provider)."""
