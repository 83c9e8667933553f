"""Fault scenarios for the scheduler: real processes, one PostgreSQL, nothing lost.

Run ``python -m reliability --help`` from the repository root; docs/reliability.md has the
scenarios and the figures measured.
"""
