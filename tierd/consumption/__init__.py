"""The consumption model's new part: RocketMQ 5 style receive / ack (in-flight leases, acks,
redelivery) over the committed-offset store (docs/grpc.md).

The older consumption modules (subscriptions, committed offsets, groups, long polling) still
live at the top level of the package; they move here in a later change.
"""
