"""The fault suite (issue 12): real processes killed at random moments, provider faults in
random mixtures, database faults; every figure counted where it happens (the provider's own
log or server for money, the database for episodes), written to docs/reliability.md.

Run: make reliability  (or .venv/bin/python -m reliability --help)
"""
