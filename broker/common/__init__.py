"""What every broker subsystem may use: configuration, topic configs, logging set-up,
the request-path histogram, the millisecond clocks, atomic file writes, the background
task nursery objects are built with, and the garbage-collector policy.

Imports nothing else of the broker's; everything else may import it."""
