"""Partitions and their replication (Kafka's ``Partition``, ``ReplicaManager``,
``DelayedProduce``/``DelayedFetch``, ``ReplicaFetcherManager``): the produce and fetch
paths, the ISR and high watermark, follower fetchers and ISR change proposals."""
