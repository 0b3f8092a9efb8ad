"""Kafka's ``kafka.network`` and the peer side of it: the socket server (one selector loop
for every connection), each connection's outbox and session, parked answers, request
metrics, answers deferred until catch-up (or by a fault), broker-to-broker RPC and the
cluster-secret handshake.

Knows requests as frames and handlers as callables; nothing of partitions or the quorum."""
