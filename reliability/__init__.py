"""The fault suite: real processes killed at random moments, provider faults in random
mixtures, database faults; every figure counted where it happens (the provider's own log or
server for money, the database for episodes), written to docs/reliability.md.

`reliability.harness` runs the trials, `reliability.oracle` counts (independently of the
product's own predicates), `reliability.scenarios` holds one module per fault family.

Run: make reliability  (or .venv/bin/python -m reliability --help)
"""
