"""Partitions and their replication (Kafka's ``Partition``, ``ReplicaManager``,
``DelayedProduce``/``DelayedFetch``, ``ReplicaFetcherManager``): the produce and fetch
paths, the ISR and high watermark, follower fetchers, ISR change proposals and the
periodic chores (ISR shrink, retention, producer-id expiry)."""
