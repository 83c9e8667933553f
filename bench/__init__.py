"""Benchmarks for the scheduler: claim cost, drain throughput, HTTP storing, shutdown, memory.

Every figure that matters is a ratio measured side by side in one run (the machines are
shared and noisy). ``python -m bench --help`` (or ``scheduler bench --help``) lists the
benchmarks; ``docs/performance.md`` explains the method and quotes the latest table.
"""
