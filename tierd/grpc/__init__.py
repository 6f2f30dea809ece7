"""The RocketMQ 5 gRPC API (``apache.rocketmq.v2.MessagingService``), next to the HTTP API:
unmodified RocketMQ clients produce to and consume from tierd (docs/grpc.md).

The wire types are the generated modules the official ``rocketmq-python-client`` package ships
(``rocketmq.grpc_protocol``; the ``grpc`` extra); nothing here imports them at package import,
so tierd without the extra still runs with ``grpc.enabled = false``.
"""
