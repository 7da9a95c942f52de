"""The simulated engine: an OpenAI-compatible server that behaves like vLLM without a GPU.

It lets the whole of llmgw (the Nomad and Consul stand-ins, the router, the
reconciler) run on a laptop and in tests against real processes. See
DESIGN.md beside this file.

Public face (import from the modules; this package imports nothing, so that
`llmgw --help` does not pay for aiohttp):

- `llmgw.sim.settings`: `SimSettings`, `FaultSettings`, `ExitCode`,
  `add_sim_arguments(parser)`, `settings_from_namespace(namespace, environ)`.
- `llmgw.sim.app`: `create_app(settings, deps=None) -> web.Application`,
  `SimDeps`, `STATE` (the app key of its `SimState`).
- `llmgw.sim.server`: `main(argv)`, `run_from_namespace(...)`, `serve(settings)`.
- `llmgw.sim.startup_policy`: `refusals(...)`, the start-policy seam.

Its test helpers (`fast_settings`, `start_sim_process`, `SimProcess`)
live in `tests/support/sim.py`, outside the wheel.

Must not import the other programs (gateway, control, devcluster, mirror).
"""
