"""`python -m bench` (== `make bench`): the performance figures of DESIGN.md, measured.

Runs against a database of its own (`agentplatform_bench`, recreated each run)
on the same PostgreSQL server, a Celery queue of its own (`bench-<pid>`), and
real daphne / Celery worker / beat processes it starts and stops itself. See
bench/README.md for what each benchmark measures and how.
"""
