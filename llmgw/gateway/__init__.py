"""The OpenAI-compatible router (see DESIGN.md beside this file).

Public face:

- ``RouterSettings`` (``settings``): every timeout and limit, ``from_env_and_args``,
  ``add_router_arguments`` for the CLI.
- ``RouterDeps`` and the ports (``ports``): what the router reads and writes outside itself.
- ``create_app(settings, deps)``, ``RouterServer``, ``run_router(settings, deps, stop=)`` (``app``).
- ``new_api_key(name, now=, ...)`` (``keys``): a key to show once and the record to store.

Importing this package does not import aiohttp; import the modules above.
"""
