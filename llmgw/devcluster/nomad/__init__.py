"""The Nomad stand-in behind `llmgw dev`: its HTTP API, state and job parsing."""
