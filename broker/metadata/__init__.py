"""Cluster metadata (Kafka's ``MetadataImage`` and metadata records): the image every
broker serves from, the records of the metadata log that build it, and the checks an
image must pass."""
