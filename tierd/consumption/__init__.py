"""The consumption model, one package that HTTP and gRPC both reach through the facade
(``tierd.store``): tag subscriptions (``subscription``), committed offsets on disk and in the
bucket (``offsets``), consumer groups (``groups``), long polling (``longpoll``), RocketMQ 5
receive / ack with in-flight leases, redelivery and dead letters (``inflight``) and the offset
RPCs of pull-style clients (``pull``).

``subscription`` and ``offsets`` are leaves: the hot store and the tiering engine use them too
(a tag filter is applied where the units are read; restore reads the committed offsets back from
the bucket). The other modules sit at the facade's level (docs/design.md, layer rules).
"""
