"""Cluster metadata (Kafka's ``MetadataImage`` and metadata records): the image every
broker serves from, the records of the metadata log that build it, the checks an
image must pass, and the cache of what this broker serves now (Kafka's MetadataCache)."""
