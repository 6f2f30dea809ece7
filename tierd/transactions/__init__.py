"""Transactional messages (docs/transactions.md): a half message, invisible until its producer
commits it; rolled back when the producer says so, or when it stays silent through every
check-back.

:mod:`tierd.transactions.names` owns the names (system topics, properties) and the identifiers;
:mod:`tierd.transactions.coordinator` keeps the state, resolves and checks back. The facade
(:class:`tierd.MessageStore`) is the only caller; the access layers go through it.
"""
