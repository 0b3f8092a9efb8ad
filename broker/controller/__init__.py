"""The controller (Kafka's ``QuorumController`` side): what the active controller decides
(replica placement, leader election, producer-id blocks) and how every broker finds,
registers with and heartbeats to whichever voter is the active controller."""
