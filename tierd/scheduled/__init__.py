"""Delayed and timer messages (docs/scheduled.md): a message put now and visible in its topic at
(not before) a given time, or recalled before then.

:mod:`tierd.scheduled.timing` owns the names (system topics, properties) and the time rules;
:mod:`tierd.scheduled.scheduler` delivers. This package imports nothing of the store at import
time, so the configuration can use the time rules.
"""
